"use client";
// The thread in the URL (`?thread=...`, a new one on first visit), its history loaded from
// Spool, then the chat. A reload keeps the thread, shows the history and replays the answer in
// progress (useChat's `resume`).
import { useEffect, useState } from "react";
import type { UIMessage } from "ai";
import { SpoolError, loadThreadMessages } from "@spool/ai-sdk";

import { Chat } from "./chat";
import { connection, session } from "./session";

export default function Page() {
  const [state, setState] = useState<{
    thread: string;
    messages: UIMessage[];
    baseUrl: string;
    agentId: string | null;
  }>();
  const [error, setError] = useState<string>();

  useEffect(() => {
    const url = new URL(window.location.href);
    let thread = url.searchParams.get("thread");
    if (!thread) {
      thread = crypto.randomUUID();
      url.searchParams.set("thread", thread);
      window.history.replaceState(null, "", url);
    }
    const id = thread;
    (async () => {
      const { baseUrl, agentId } = await session();
      // A thread is created by its first message: until then there is no history.
      const messages = await loadThreadMessages(await connection(), id).catch((e: unknown) => {
        if (e instanceof SpoolError && e.status === 404) return [];
        throw e;
      });
      setState({ thread: id, messages, baseUrl, agentId });
    })().catch((e: unknown) => setError(String(e)));
  }, []);

  if (error) return <p role="alert">{error}</p>;
  if (!state) return <p>Loading…</p>;
  return (
    <Chat thread={state.thread} initialMessages={state.messages} baseUrl={state.baseUrl} agentId={state.agentId} />
  );
}
