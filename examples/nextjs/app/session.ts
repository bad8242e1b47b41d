// The browser's Spool connection: base URL and agent from the app's route handler, and a token
// fetched again a minute before it expires.
import type { SpoolConnection } from "@spool/ai-sdk";

interface Session {
  baseUrl: string;
  agentId: string | null;
  token: string;
  expiresAt: number;
}

let current: Promise<Session> | undefined;

export function session(): Promise<Session> {
  const fresh = (s: Session) => s.expiresAt - 60 > Date.now() / 1000;
  const next = async (): Promise<Session> => {
    const cached = current && (await current.catch(() => undefined));
    if (cached && fresh(cached)) return cached;
    const response = await fetch("/api/spool", { cache: "no-store" });
    if (!response.ok) throw new Error(`/api/spool answered ${response.status}`);
    return (await response.json()) as Session;
  };
  current = next();
  return current;
}

export async function connection(): Promise<SpoolConnection> {
  const { baseUrl } = await session();
  return { baseUrl, token: async () => (await session()).token };
}
