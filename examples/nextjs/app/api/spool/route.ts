// The browser's Spool session: where Spool is, which agent answers, and a short-lived Spool
// token for the signed-in user. Spool verifies HS256 tokens signed with its SPOOL_JWT_SECRET
// (docs/api.md, Authentication); this handler signs one with the same secret, so the secret
// stays on the server and the browser holds a token that expires in 15 minutes.
//
// The user here is fixed (SPOOL_EXAMPLE_USER of SPOOL_EXAMPLE_TENANT): put your session's user
// in `sub` instead (and your tenant), after your own sign-in check.
import { createHmac } from "node:crypto";

export const dynamic = "force-dynamic";

const TTL_SECONDS = 15 * 60;

function base64url(data: string | Buffer): string {
  return Buffer.from(data).toString("base64url");
}

function sign(claims: Record<string, unknown>, secret: string): string {
  const header = base64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const payload = base64url(JSON.stringify(claims));
  const signature = createHmac("sha256", secret).update(`${header}.${payload}`).digest("base64url");
  return `${header}.${payload}.${signature}`;
}

export function GET(): Response {
  const secret = process.env.SPOOL_JWT_SECRET;
  if (!secret) {
    return Response.json({ error: "SPOOL_JWT_SECRET is not set on the Next.js server" }, { status: 500 });
  }
  const expiresAt = Math.floor(Date.now() / 1000) + TTL_SECONDS;
  const token = sign(
    {
      sub: process.env.SPOOL_EXAMPLE_USER ?? "demo",
      tenant: process.env.SPOOL_EXAMPLE_TENANT ?? "acme",
      exp: expiresAt,
    },
    secret,
  );
  return Response.json(
    {
      baseUrl: process.env.SPOOL_URL ?? "http://127.0.0.1:8080",
      agentId: process.env.SPOOL_AGENT_ID || null,
      token,
      expiresAt,
    },
    { headers: { "Cache-Control": "no-store" } },
  );
}
