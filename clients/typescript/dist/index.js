// @spool/ai-sdk: a `ChatTransport` for the AI SDK's `useChat` that talks to Spool.
//
// - `sendMessages` posts the last user message (`POST /v1/threads/{id}/user_message`) and follows
//   the run's `?format=ai-sdk` stream, opened with a stream token (`POST .../stream_token`), never
//   the long-lived token.
// - A dropped connection is resumed with `Last-Event-ID` (a fresh stream token each time) inside
//   the same stream `useChat` reads; `reconnectToStream` replays the message in progress from its
//   start (`resumeStreamIsReplay`), or answers `null` when nothing streams (a `204`).
// - Spool's pauses become the SDK's own flows: a client tool call (`requires_action`) is a
//   `tool-input-available` chunk the SDK hands to `onToolCall`, answered with `addToolOutput`; a
//   call that waits for a person (`approval_requested`) is a `tool-approval-request`, answered
//   with `addToolApprovalResponse`. With `sendAutomaticallyWhen`, the SDK then calls
//   `sendMessages` again, which posts the outputs or decisions to the run and follows it on.
// - `loadThreadMessages` reads a thread's history as `UIMessage`s.
/** An error answer of Spool's API (`{"error": {"code", "message"}}`). */
export class SpoolError extends Error {
    status;
    code;
    constructor(status, code, message) {
        super(`${code}: ${message}`);
        this.name = "SpoolError";
        this.status = status;
        this.code = code;
    }
}
/** A `ChatTransport` for `useChat` that sends through Spool (see the module comment). */
export class SpoolChatTransport {
    /** A reconnection replays the message in progress from its start. */
    resumeStreamIsReplay = true;
    options;
    chats = new Map();
    constructor(options) {
        this.options = options;
    }
    sendMessages = async ({ chatId, messages, trigger, abortSignal }) => {
        if (trigger === "regenerate-message") {
            throw new SpoolError(400, "regenerate_not_supported", "Spool keeps every answer: send a new message instead");
        }
        const chat = this.chat(chatId);
        const last = messages[messages.length - 1];
        if (last === undefined) {
            throw new SpoolError(400, "no_message", "there is no message to send");
        }
        if (last.role === "assistant") {
            const answered = await this.answerPause(chatId, chat, last);
            const stream = await this.follow(chatId, chat, answered.cursor, abortSignal, answered.skipUntil, last.id);
            return stream ?? storedAnswer(this.options, chatId, last.id);
        }
        const input = last.parts
            .filter((part) => part.type === "text")
            .map((part) => part.text)
            .join("");
        const body = { input_text: input };
        if (this.options.agentId)
            body.agent_id = this.options.agentId;
        const accepted = (await request(this.options, "POST", `/v1/threads/${chatId}/user_message`, body, abortSignal));
        chat.runs.set(accepted.message_id, accepted.workflow_id);
        // After the previous message's end, the stream follows the next message (this one), even
        // if it is already over; with no cursor, the message in progress.
        const cursor = chat.completed ? chat.lastEventId : undefined;
        const stream = await this.follow(chatId, chat, cursor, abortSignal, undefined, accepted.message_id);
        if (stream !== null)
            return stream;
        // Nothing streams any more: the answer was quicker than the stream; it is stored.
        return storedAnswer(this.options, chatId, accepted.message_id);
    };
    reconnectToStream = async ({ chatId, abortSignal }) => {
        const chat = this.chat(chatId);
        return this.follow(chatId, chat, undefined, abortSignal);
    };
    chat(chatId) {
        let chat = this.chats.get(chatId);
        if (!chat) {
            chat = { completed: false, clientCalls: new Set(), answered: new Set(), approvals: new Set(), denied: new Set(), runs: new Map() };
            this.chats.set(chatId, chat);
        }
        return chat;
    }
    /**
     * Posts what the user answered in `message` (client tool outputs, approval decisions) to its
     * run. Returns where to follow from: the last chunk received, or, when this transport has not
     * followed the run (a reloaded page), a replay that skips to after the answered pause.
     */
    async answerPause(chatId, chat, message) {
        const tools = message.parts.filter(isToolPart);
        // The client tool calls the run waits for, answered (`addToolOutput`).
        const outputs = tools.filter((part) => chat.clientCalls.has(part.toolCallId) && (part.state === "output-available" || part.state === "output-error"));
        const decisions = tools.filter((part) => part.state === "approval-responded");
        if (outputs.length === 0 && decisions.length === 0) {
            throw new SpoolError(400, "nothing_to_answer", "the last message answers no tool call Spool waits for");
        }
        const workflowId = await this.runOf(chatId, chat, message.id);
        if (outputs.length > 0) {
            const toolOutputs = outputs.map((part) => ({
                tool_call_id: part.toolCallId,
                output: part.state === "output-error" ? `error: ${part.errorText ?? ""}` : (part.output ?? null),
            }));
            await request(this.options, "POST", `/v1/workflows/${workflowId}/tool_outputs`, { tool_outputs: toolOutputs });
            for (const part of outputs) {
                chat.clientCalls.delete(part.toolCallId);
                chat.answered.add(part.toolCallId);
            }
        }
        for (const part of decisions) {
            const approval = part.approval;
            if (!approval.approved)
                chat.denied.add(part.toolCallId);
            const decision = { approved: approval.approved };
            if (approval.reason)
                decision.reason = approval.reason;
            await request(this.options, "POST", `/v1/workflows/${workflowId}/approvals/${encodeURIComponent(part.toolCallId)}`, decision);
        }
        if (chat.lastEventId)
            return { cursor: chat.lastEventId };
        return { skipUntil: new Set([...outputs, ...decisions].map((part) => part.toolCallId)) };
    }
    /** Whether the run writing `messageId` waits for any of `calls` now. */
    async waitsFor(chatId, chat, messageId, calls) {
        const workflowId = await this.runOf(chatId, chat, messageId);
        const run = (await request(this.options, "GET", `/v1/workflows/${workflowId}`));
        return pendingCalls(run).some((call) => calls.includes(call));
    }
    /** The run that writes the assistant message `messageId`. */
    async runOf(chatId, chat, messageId) {
        const known = chat.runs.get(messageId);
        if (known)
            return known;
        const page = (await request(this.options, "GET", `/v1/workflows?thread_id=${chatId}&limit=20`));
        const run = page.data.find((run) => run.message_id === messageId);
        if (!run)
            throw new SpoolError(404, "run_not_found", `no run of this thread writes message ${messageId}`);
        chat.runs.set(messageId, run.workflow_id);
        return run.workflow_id;
    }
    /**
     * The chunks of the thread's stream after `cursor` (none: the message in progress from its
     * start), resumed with `Last-Event-ID` whenever the connection drops, until `[DONE]`. `null`
     * when nothing streams. With `skipUntil`, a replay's chunks up to the pause that waited for
     * these calls are left out (the client has them). `messageId`: the assistant message it
     * follows, when known (a stream resumed after a pause has no `start` chunk).
     */
    async follow(chatId, chat, cursor, signal, skipUntil, messageId) {
        const first = await this.open(chatId, cursor, signal);
        if (first === null)
            return null;
        const maxReconnects = this.options.maxReconnects ?? 5;
        const baseDelay = this.options.reconnectDelayMs ?? 500;
        let skipping = skipUntil !== undefined && skipUntil.size > 0;
        const self = this;
        /** The assistant message followed (known, or from the `start` chunk). */
        let message = messageId;
        async function* chunks() {
            let response = first;
            let failures = 0;
            for (;;) {
                let finished = false;
                if (response !== null) {
                    try {
                        for await (const event of serverSentEvents(response.body)) {
                            if (event.id !== undefined)
                                chat.lastEventId = event.id;
                            if (event.data === "[DONE]") {
                                chat.completed = true;
                                finished = true;
                                break;
                            }
                            failures = 0;
                            chat.completed = false;
                            const chunk = JSON.parse(event.data);
                            if (chunk.type === "start" && chunk.messageId)
                                message = chunk.messageId;
                            if (skipping) {
                                if (pausedFor(chunk, skipUntil))
                                    skipping = false;
                                continue;
                            }
                            const pause = pauseCalls(chunk);
                            if (pause !== null) {
                                // A replay holds the pauses already answered too: only the one the run waits
                                // for now is the SDK's to answer; it ends this stream (the SDK then answers it).
                                if (message === undefined || !(await self.waitsFor(chatId, chat, message, pause)))
                                    continue;
                                yield* self.map(chat, chunk);
                                return;
                            }
                            yield* self.map(chat, chunk);
                        }
                    }
                    catch (error) {
                        if (signal?.aborted)
                            throw error;
                        // The connection dropped: resume below.
                    }
                }
                if (finished || signal?.aborted)
                    return;
                failures += 1;
                if (failures > maxReconnects) {
                    throw new SpoolError(503, "stream_lost", `the stream dropped ${maxReconnects} times in a row`);
                }
                await sleep(Math.min(baseDelay * 2 ** (failures - 1), 8000), signal);
                try {
                    response = await self.open(chatId, chat.lastEventId, signal);
                }
                catch (error) {
                    if (signal?.aborted || (error instanceof SpoolError && error.status < 500 && error.status !== 429)) {
                        throw error;
                    }
                    response = null;
                    continue;
                }
                if (response === null)
                    return;
            }
        }
        const iterator = chunks();
        return new ReadableStream({
            async pull(controller) {
                try {
                    const { value, done } = await iterator.next();
                    if (done)
                        controller.close();
                    else
                        controller.enqueue(value);
                }
                catch (error) {
                    controller.error(error);
                }
            },
            async cancel() {
                await iterator.return(undefined);
            },
        });
    }
    /** Opens the thread's `ai-sdk` stream with a fresh stream token; `null` on a `204`. */
    async open(chatId, cursor, signal) {
        const minted = (await request(this.options, "POST", `/v1/threads/${chatId}/stream_token`, undefined, signal));
        const headers = { Authorization: `Bearer ${minted.token}`, Accept: "text/event-stream" };
        if (cursor !== undefined)
            headers["Last-Event-ID"] = cursor;
        const fetcher = this.options.fetch ?? globalThis.fetch;
        const response = await fetcher(`${this.options.baseUrl}/v1/threads/${chatId}/stream?format=ai-sdk`, {
            headers,
            signal,
        });
        if (response.status === 204)
            return null;
        if (!response.ok || response.body === null)
            throw await errorOf(response);
        return response;
    }
    /** A chunk of Spool's stream as the SDK's flows want it. */
    *map(chat, chunk) {
        const any = chunk;
        switch (any.type) {
            case "data-spool-requires-action": {
                const data = any.data;
                for (const call of data.tool_calls) {
                    chat.clientCalls.add(call.tool_call_id);
                    // Not provider-executed: the SDK hands it to `onToolCall`, and `addToolOutput` answers it.
                    yield {
                        type: "tool-input-available",
                        toolCallId: call.tool_call_id,
                        toolName: call.tool_name,
                        input: call.arguments,
                        providerExecuted: false,
                    };
                }
                return;
            }
            case "data-spool-approval-requested": {
                const data = any.data;
                chat.approvals.add(data.tool_call_id);
                yield { type: "tool-approval-request", approvalId: data.tool_call_id, toolCallId: data.tool_call_id };
                return;
            }
            case "tool-input-available":
            case "tool-output-available":
            case "tool-output-error": {
                const id = any.toolCallId ?? "";
                if (chat.denied.has(id) && any.type !== "tool-input-available") {
                    yield { type: "tool-output-denied", toolCallId: id };
                    return;
                }
                if (chat.clientCalls.has(id) || chat.answered.has(id)) {
                    // The client ran it, not Spool.
                    yield { ...chunk, providerExecuted: false };
                    return;
                }
                yield chunk;
                return;
            }
            default:
                yield chunk;
        }
    }
}
/** The calls a pause chunk waits for; `null` for any other chunk. */
function pauseCalls(chunk) {
    const any = chunk;
    if (any.type === "data-spool-requires-action") {
        return (any.data?.tool_calls ?? []).map((call) => call.tool_call_id);
    }
    if (any.type === "data-spool-approval-requested") {
        return [any.data?.tool_call_id ?? ""];
    }
    return null;
}
/** Whether `chunk` is the pause that waited for the calls `calls`. */
function pausedFor(chunk, calls) {
    return (pauseCalls(chunk) ?? []).some((call) => calls.has(call));
}
/** The calls a run's `pending_action` waits for. */
function pendingCalls(run) {
    const action = run.pending_action;
    if (!action)
        return [];
    if (action.tool_calls)
        return action.tool_calls.map((call) => call.tool_call_id);
    return action.tool_call_id ? [action.tool_call_id] : [];
}
function isToolPart(part) {
    return (part.type.startsWith("tool-") || part.type === "dynamic-tool") && "toolCallId" in part;
}
/**
 * The thread's messages as `UIMessage`s, oldest first (`initialMessages` of `useChat`): user
 * messages as text, assistant messages with their text, tool calls (and results) as tool parts,
 * and cited sources as `source-url` parts. `metadata.spool` holds each message's status and run.
 */
export async function loadThreadMessages(connection, threadId, options = {}) {
    const max = options.maxMessages ?? 1000;
    let stored = [];
    let before;
    while (stored.length < max) {
        const query = `limit=200${before ? `&before=${before}` : ""}`;
        const page = (await request(connection, "GET", `/v1/threads/${threadId}/messages?${query}`));
        stored = page.messages.concat(stored);
        if (page.messages.length < 200)
            break;
        before = page.messages[0].id;
    }
    return stored
        .filter((message) => message.role === "user" || message.role === "assistant")
        .map(toUIMessage);
}
/** One stored message as a `UIMessage`. */
export function toUIMessage(message) {
    const metadata = {
        spool: { status: message.status, workflowId: message.workflow_id ?? null, createdAt: message.created_at },
    };
    const role = message.role === "assistant" ? "assistant" : "user";
    if (role === "user" || !message.parts || message.parts.length === 0) {
        return { id: message.id, role, metadata, parts: message.content ? [{ type: "text", text: message.content, state: "done" }] : [] };
    }
    const parts = [{ type: "step-start" }];
    const calls = new Map();
    let afterResult = false;
    for (const part of message.parts) {
        switch (part.type) {
            case "text":
                if (afterResult)
                    parts.push({ type: "step-start" });
                afterResult = false;
                parts.push({ type: "text", text: part.text, state: "done" });
                break;
            case "tool_call": {
                if (afterResult)
                    parts.push({ type: "step-start" });
                afterResult = false;
                const tool = {
                    type: `tool-${part.name}`,
                    toolCallId: part.tool_call_id,
                    state: "input-available",
                    input: parseJson(part.arguments),
                    providerExecuted: true,
                };
                calls.set(part.tool_call_id, tool);
                parts.push(tool);
                break;
            }
            case "tool_result": {
                afterResult = true;
                const tool = calls.get(part.tool_call_id);
                if (!tool)
                    break;
                if (part.is_error) {
                    tool.state = "output-error";
                    tool.errorText = part.output;
                }
                else {
                    tool.state = "output-available";
                    tool.output = part.output;
                }
                break;
            }
            case "citations":
                for (const citation of part.citations) {
                    if (typeof citation.url !== "string")
                        continue;
                    const source = { type: "source-url", sourceId: citation.url, url: citation.url };
                    if (typeof citation.title === "string")
                        source.title = citation.title;
                    parts.push(source);
                }
                break;
        }
    }
    return { id: message.id, role, metadata, parts };
}
/**
 * Whether a part was superseded: text a crashed attempt showed that its successor wrote
 * differently (Spool marks it; hide it). `superseded` is the set of part ids named by
 * `data-spool-superseded` parts of the same message.
 */
export function isSuperseded(part, superseded = new Set()) {
    const meta = part.providerMetadata;
    if (meta?.spool?.superseded)
        return true;
    const id = part.id;
    return typeof id === "string" && superseded.has(id);
}
/** The parts of `message` a UI shows: without superseded text and Spool's own data parts. */
export function visibleParts(message) {
    const superseded = new Set(message.parts
        .filter((part) => part.type === "data-spool-superseded")
        .map((part) => (part.data?.id ?? "")));
    return message.parts.filter((part) => !part.type.startsWith("data-spool-") && !isSuperseded(part, superseded));
}
async function token(connection) {
    return typeof connection.token === "function" ? await connection.token() : connection.token;
}
/** A JSON request to Spool's API; throws a `SpoolError` for an error answer. */
async function request(connection, method, path, body, signal) {
    const headers = { Authorization: `Bearer ${await token(connection)}` };
    if (body !== undefined)
        headers["Content-Type"] = "application/json";
    const fetcher = connection.fetch ?? globalThis.fetch;
    const response = await fetcher(`${connection.baseUrl}${path}`, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
    });
    if (!response.ok)
        throw await errorOf(response);
    return response.status === 204 ? null : response.json();
}
async function errorOf(response) {
    const text = await response.text().catch(() => "");
    try {
        const body = JSON.parse(text);
        return new SpoolError(response.status, body.error?.code ?? "http_error", body.error?.message ?? text);
    }
    catch {
        return new SpoolError(response.status, "http_error", text || response.statusText);
    }
}
/** The events of an SSE body: each with its `id:` (if any) and its `data:` lines joined. */
export async function* serverSentEvents(body) {
    const decoder = new TextDecoder();
    const reader = body.getReader();
    let buffer = "";
    let id;
    let data = [];
    try {
        for (;;) {
            const { value, done } = await reader.read();
            if (done)
                return;
            buffer += decoder.decode(value, { stream: true });
            let newline;
            while ((newline = buffer.search(/\r\n|\r|\n/)) !== -1) {
                const line = buffer.slice(0, newline);
                buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
                if (line === "") {
                    if (data.length > 0)
                        yield { id, data: data.join("\n") };
                    id = undefined;
                    data = [];
                    continue;
                }
                if (line.startsWith(":"))
                    continue;
                const colon = line.indexOf(":");
                const field = colon === -1 ? line : line.slice(0, colon);
                let value = colon === -1 ? "" : line.slice(colon + 1);
                if (value.startsWith(" "))
                    value = value.slice(1);
                if (field === "data")
                    data.push(value);
                else if (field === "id")
                    id = value;
            }
        }
    }
    finally {
        reader.releaseLock();
        await body.cancel().catch(() => undefined);
    }
}
function parseJson(text) {
    try {
        return JSON.parse(text);
    }
    catch {
        return text;
    }
}
function sleep(ms, signal) {
    return new Promise((resolve, reject) => {
        if (signal?.aborted)
            return reject(signal.reason);
        const timer = setTimeout(resolve, ms);
        signal?.addEventListener("abort", () => {
            clearTimeout(timer);
            reject(signal.reason);
        }, { once: true });
    });
}
/** The stored assistant message `messageId` as the chunks of a stream that shows it. */
async function storedAnswer(connection, threadId, messageId) {
    const messages = await loadThreadMessages(connection, threadId, { maxMessages: 200 });
    const message = messages.find((m) => m.id === messageId);
    const chunks = [{ type: "start", messageId }];
    let step = false;
    let n = 0;
    for (const part of message?.parts ?? []) {
        const any = part;
        if (any.type === "step-start") {
            if (step)
                chunks.push({ type: "finish-step" });
            chunks.push({ type: "start-step" });
            step = true;
        }
        else if (any.type === "text") {
            const id = `stored_${n++}`;
            chunks.push({ type: "text-start", id }, { type: "text-delta", id, delta: any.text }, { type: "text-end", id });
        }
        else if (any.type === "source-url") {
            chunks.push({ type: "source-url", sourceId: any.sourceId, url: any.url, title: any.title });
        }
        else if (any.type.startsWith("tool-")) {
            const toolCallId = any.toolCallId;
            chunks.push({ type: "tool-input-available", toolCallId, toolName: any.type.slice(5), input: any.input, providerExecuted: true });
            if (any.state === "output-available") {
                chunks.push({ type: "tool-output-available", toolCallId, output: any.output, providerExecuted: true });
            }
            else if (any.state === "output-error") {
                chunks.push({ type: "tool-output-error", toolCallId, errorText: any.errorText, providerExecuted: true });
            }
        }
    }
    if (step)
        chunks.push({ type: "finish-step" });
    const status = message?.metadata?.spool.status;
    chunks.push(status === "cancelled"
        ? { type: "abort", reason: "cancelled" }
        : { type: "finish", finishReason: status === "failed" ? "error" : "stop" });
    return new ReadableStream({
        start(controller) {
            for (const chunk of chunks)
                controller.enqueue(chunk);
            controller.close();
        },
    });
}
