-- Which graph agents reference a tool (an MCP server in `graph_spec.tools.mcp_servers`): the
-- refusal of a DELETE of a tool in use (409 `tool_in_use`) sees them as it sees `tool_ids`.
CREATE INDEX agents_graph_mcp_servers_idx
    ON agents USING gin ((spec -> 'graph_spec' -> 'tools' -> 'mcp_servers') jsonb_path_ops);
