-- The tools a run's MCP servers offered when its first attempt discovered them, by server
-- (`{"<server name>": [{"name", "remote_name", "description", "parameters", "read_only"}]}`,
-- worker/src/agent/tools.rs `McpTools`), written by that attempt (fenced on it). Later attempts
-- (after a crash, a pause, a wait for child runs) offer the same tools without discovering them
-- again, and connect to a server only when one of its tools is called. NULL: not discovered yet
-- (or the agent has no MCP server). Read only by the worker, never with the run's other columns.
ALTER TABLE runs ADD COLUMN mcp_tools jsonb;
