import type { ChatTransport, UIMessage } from "ai";
/** Where Spool is and who is asking. */
export interface SpoolConnection {
    /** Spool's base URL (`http://localhost:8080`); `""` for the page's own origin. */
    baseUrl: string;
    /** A Spool token (`spool-api token`, or your identity provider's), or a function that returns one. */
    token: string | (() => string | Promise<string>);
    /** The `fetch` to use (default: the global one). */
    fetch?: typeof fetch;
}
/** How the transport sends and follows. */
export interface SpoolChatTransportOptions extends SpoolConnection {
    /** The agent that answers (`agent_id`; else the thread's, else the default). */
    agentId?: string;
    /** Reconnections in a row without a single chunk received before the stream fails (default 5). */
    maxReconnects?: number;
    /** The first reconnection's delay in milliseconds, doubled each time up to 8 s (default 500). */
    reconnectDelayMs?: number;
}
/** An error answer of Spool's API (`{"error": {"code", "message"}}`). */
export declare class SpoolError extends Error {
    readonly status: number;
    readonly code: string;
    constructor(status: number, code: string, message: string);
}
/** A stored message part, as `GET /v1/threads/{id}/messages` sends it. */
type StoredPart = {
    type: "text";
    text: string;
} | {
    type: "tool_call";
    tool_call_id: string;
    name: string;
    arguments: string;
    step?: number | null;
} | {
    type: "tool_result";
    tool_call_id: string;
    name: string;
    output: string;
    is_error: boolean;
    step?: number | null;
} | {
    type: "citations";
    citations: {
        url?: unknown;
        title?: unknown;
    }[];
};
/** A stored message. */
interface StoredMessage {
    id: string;
    role: "user" | "assistant" | "system" | "tool";
    content: string;
    parts?: StoredPart[];
    status: string;
    workflow_id?: string | null;
    created_at: string;
    metadata?: Record<string, unknown>;
}
/** Spool's own data about a `UIMessage` (its `metadata.spool`). */
export interface SpoolMessageMetadata {
    spool: {
        status: string;
        workflowId: string | null;
        createdAt: string;
    };
}
/** A `ChatTransport` for `useChat` that sends through Spool (see the module comment). */
export declare class SpoolChatTransport<UI_MESSAGE extends UIMessage = UIMessage> implements ChatTransport<UI_MESSAGE> {
    /** A reconnection replays the message in progress from its start. */
    readonly resumeStreamIsReplay = true;
    private readonly options;
    private readonly chats;
    constructor(options: SpoolChatTransportOptions);
    sendMessages: ChatTransport<UI_MESSAGE>["sendMessages"];
    reconnectToStream: ChatTransport<UI_MESSAGE>["reconnectToStream"];
    private chat;
    /**
     * Posts what the user answered in `message` (client tool outputs, approval decisions) to its
     * run. Returns where to follow from: the last chunk received, or, when this transport has not
     * followed the run (a reloaded page), a replay that skips to after the answered pause.
     */
    private answerPause;
    /** Whether the run writing `messageId` waits for any of `calls` now. */
    private waitsFor;
    /** The run that writes the assistant message `messageId`. */
    private runOf;
    /**
     * The chunks of the thread's stream after `cursor` (none: the message in progress from its
     * start), resumed with `Last-Event-ID` whenever the connection drops, until `[DONE]`. `null`
     * when nothing streams. With `skipUntil`, a replay's chunks up to the pause that waited for
     * these calls are left out (the client has them). `messageId`: the assistant message it
     * follows, when known (a stream resumed after a pause has no `start` chunk).
     */
    private follow;
    /** Opens the thread's `ai-sdk` stream with a fresh stream token; `null` on a `204`. */
    private open;
    /** A chunk of Spool's stream as the SDK's flows want it. */
    private map;
}
/**
 * The thread's messages as `UIMessage`s, oldest first (`initialMessages` of `useChat`): user
 * messages as text, assistant messages with their text, tool calls (and results) as tool parts,
 * and cited sources as `source-url` parts. `metadata.spool` holds each message's status and run.
 */
export declare function loadThreadMessages(connection: SpoolConnection, threadId: string, options?: {
    maxMessages?: number;
}): Promise<UIMessage<SpoolMessageMetadata>[]>;
/** One stored message as a `UIMessage`. */
export declare function toUIMessage(message: StoredMessage): UIMessage<SpoolMessageMetadata>;
/**
 * Whether a part was superseded: text a crashed attempt showed that its successor wrote
 * differently (Spool marks it; hide it). `superseded` is the set of part ids named by
 * `data-spool-superseded` parts of the same message.
 */
export declare function isSuperseded(part: UIMessage["parts"][number], superseded?: ReadonlySet<string>): boolean;
/** The parts of `message` a UI shows: without superseded text and Spool's own data parts. */
export declare function visibleParts<M extends UIMessage>(message: M): M["parts"];
/** The events of an SSE body: each with its `id:` (if any) and its `data:` lines joined. */
export declare function serverSentEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<{
    id?: string;
    data: string;
}>;
export {};
