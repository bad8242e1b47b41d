"use client";
// The chat: useChat over Spool's transport. Streaming and resuming are the transport's; this
// component answers the agent's client tool (`get_location`, in the browser) and shows an
// Approve / Deny choice for calls that wait for approval.
import { useChat } from "@ai-sdk/react";
import {
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
  type UIMessage,
} from "ai";
import { SpoolChatTransport, visibleParts } from "@spool/ai-sdk";
import { useMemo, useState } from "react";

import { session } from "./session";

export function Chat(props: {
  thread: string;
  initialMessages: UIMessage[];
  baseUrl: string;
  agentId: string | null;
}) {
  const transport = useMemo(
    () =>
      new SpoolChatTransport({
        baseUrl: props.baseUrl,
        token: async () => (await session()).token,
        agentId: props.agentId ?? undefined,
      }),
    [props.baseUrl, props.agentId],
  );
  const chat = useChat({
    id: props.thread,
    messages: props.initialMessages,
    transport,
    resume: true,
    sendAutomaticallyWhen: (options) =>
      lastAssistantMessageIsCompleteWithToolCalls(options) || lastAssistantMessageIsCompleteWithApprovalResponses(options),
    onToolCall: ({ toolCall }) => {
      if (toolCall.toolName === "get_location") {
        // Not awaited: addToolOutput waits for this callback to return.
        void chat.addToolOutput({
          tool: "get_location",
          toolCallId: toolCall.toolCallId,
          output: { city: "Paris", source: "the browser" },
        });
      }
    },
  });
  const [input, setInput] = useState("");
  const busy = chat.status === "submitted" || chat.status === "streaming";

  return (
    <main>
      <h1>Spool + Next.js</h1>
      <ol data-testid="messages" style={{ listStyle: "none", padding: 0 }}>
        {chat.messages.map((message) => (
          <li key={message.id} data-role={message.role} style={{ margin: "1rem 0" }}>
            <strong>{message.role === "user" ? "You" : "Agent"}</strong>
            {visibleParts(message).map((part, i) => (
              <Part key={i} part={part} onDecide={(id, approved) => chat.addToolApprovalResponse({ id, approved })} />
            ))}
          </li>
        ))}
      </ol>
      {chat.error && <p role="alert">{chat.error.message}</p>}
      <form
        onSubmit={(event) => {
          event.preventDefault();
          if (!input.trim() || busy) return;
          void chat.sendMessage({ text: input });
          setInput("");
        }}
      >
        <input
          aria-label="Message"
          value={input}
          onChange={(event) => setInput(event.target.value)}
          placeholder="Ask the agent"
          style={{ width: "75%" }}
        />
        <button type="submit" disabled={busy}>
          Send
        </button>
        <span data-testid="status"> {chat.status}</span>
      </form>
    </main>
  );
}

type AnyPart = UIMessage["parts"][number];

function Part({ part, onDecide }: { part: AnyPart; onDecide: (id: string, approved: boolean) => void }) {
  if (part.type === "text") return <p data-testid="text">{part.text}</p>;
  if (!part.type.startsWith("tool-") || !("state" in part)) return null;
  const tool = part as AnyPart & {
    state: string;
    toolCallId: string;
    input?: unknown;
    output?: unknown;
    approval?: { id: string };
  };
  const name = tool.type.slice("tool-".length);
  return (
    <div data-testid="tool" data-tool={name} data-state={tool.state}>
      <code>
        {name}({JSON.stringify(tool.input ?? {})}) — {tool.state}
        {tool.output !== undefined ? `: ${typeof tool.output === "string" ? tool.output : JSON.stringify(tool.output)}` : ""}
      </code>
      {tool.state === "approval-requested" && tool.approval && (
        <span>
          {" "}
          <button onClick={() => onDecide(tool.approval!.id, true)}>Approve</button>{" "}
          <button onClick={() => onDecide(tool.approval!.id, false)}>Deny</button>
        </span>
      )}
    </div>
  );
}
