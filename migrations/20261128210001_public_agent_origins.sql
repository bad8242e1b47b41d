-- Public agents' browser origins (DESIGN section 13): a CORS preflight to a route public
-- sessions use carries no credentials, so the API asks whether any public agent lists the
-- origin (`spec->'cors_origins' ? $1`); this index answers that without reading the agents.
CREATE INDEX agents_public_cors_origins ON agents USING gin ((spec -> 'cors_origins'))
  WHERE spec ->> 'visibility' = 'public';
