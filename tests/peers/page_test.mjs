// The chat page in Chromium (Debian's, driven by playwright-core), as a user uses it.
//
// Usage: node page_test.mjs BASE TOKEN SCREENSHOT REPLY1 REPLY2
// 1. Signs in with /#token=, sends "hello page" (Enter in the only textarea); once the reply
//    streams, prints STREAMING and waits for a line on stdin (meanwhile the test cuts the
//    network and kills the worker); waits for the reply to complete.
// 2. Sends "survive a reload", reloads the page mid-answer, waits for the reply to complete.
// 3. Sends "cancel me" and clicks Cancel mid-answer.
// 4. Opens the page with a token the server refuses, then with an expired one (EXPIRED_TOKEN in
//    the environment): the sign-in form shows for both.
// Prints one JSON line with what the page showed (and how many stream URLs carried the long
// token: none should, the page uses stream tokens); saves a screenshot after step 2.
//
// Usage: node page_test.mjs --actions BASE TOKEN THREAD
// Opens /?thread=THREAD (whose agent asks the client for `read_file`, then calls a tool that
// needs an approval), sends a message, answers the client tool (its reply held until the
// approval is asked for) and approves the call through the page, and prints {text, tools} of
// the finished reply.
//
// Usage: node page_test.mjs --who BASE TOKEN OTHER_TOKEN
// Signs in with /#token=TOKEN, then follows links with /#token=OTHER_TOKEN in the same tab:
// once declining the page's question (the session stays), once by a fragment change while the
// page is open (declined too), then accepting it. Prints who the page showed at each point and
// the questions it asked.
//
// Usage: node page_test.mjs --agents BASE TOKEN AGENT_NAME
// Signs in, picks AGENT_NAME in the agent picker, reads the tool badges it shows ({text,
// health} each), sends "which agent?" and prints {options, badges, text} once the reply is done.
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

if (process.argv[2] === "--agents") {
  const [base, token, name] = process.argv.slice(3);
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox"],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (err) => errors.push(String(err)));
    await page.goto(`${base}/#token=${token}`);
    await page.locator("#agent-picker").waitFor({ state: "visible", timeout: 10000 });
    const options = await page.locator("#agent option").allTextContents();
    await page.selectOption("#agent", { label: name });
    await page.locator("#agent-tools li").first().waitFor({ state: "visible", timeout: 10000 });
    await page.waitForFunction(() => !document.querySelector("#agent-tools").hidden, null, { timeout: 10000 });
    const badges = await page.locator("#agent-tools li").evaluateAll((items) =>
      items.map((li) => ({ text: li.textContent, health: li.dataset.health })));
    await page.locator("textarea").fill("which agent?");
    await page.locator("textarea").press("Enter");
    await page.waitForFunction(() => {
      const replies = document.querySelectorAll('.message[data-role="assistant"]');
      return replies.length > 0 && replies[replies.length - 1].dataset.status === "completed";
    }, null, { timeout: 30000 });
    const text = await page.locator('.message[data-role="assistant"]').last().textContent();
    console.log(JSON.stringify({ options, badges, text, errors }));
  } finally {
    await browser.close();
  }
  process.exit(0);
}

if (process.argv[2] === "--who") {
  const [base, token, other] = process.argv.slice(3);
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox"],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (err) => errors.push(String(err)));
    const questions = [];
    let answer = false;
    page.on("dialog", async (dialog) => {
      questions.push(dialog.message());
      await (answer ? dialog.accept() : dialog.dismiss());
    });
    const who = async () => {
      await page.locator("#app").waitFor({ state: "visible", timeout: 10000 });
      return page.locator("#who").textContent();
    };
    await page.goto(`${base}/#token=${token}`);
    const first = await who();
    await page.goto(`${base}/?again#token=${other}`);
    const declined = await who();
    await page.evaluate((t) => { location.hash = `token=${t}`; }, other);
    await page.waitForFunction(() => location.hash === "", null, { timeout: 10000 });
    const fragmentDeclined = await who();
    answer = true;
    await page.goto(`${base}/?third#token=${other}`);
    await page.waitForFunction(() => !document.querySelector("#who").textContent.includes("alice"),
      null, { timeout: 10000 });
    const accepted = await who();
    console.log(JSON.stringify({ first, declined, fragmentDeclined, accepted, questions, errors }));
  } finally {
    await browser.close();
  }
  process.exit(0);
}

if (process.argv[2] === "--actions") {
  const [base, token, thread] = process.argv.slice(3);
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox"],
  });
  try {
    const page = await browser.newPage();
    page.on("console", (m) => console.error(`console ${m.type()}: ${m.text()}`));
    page.on("response", (r) => r.status() >= 400 && console.error(`response ${r.status()}: ${r.url()}`));
    // The reply to the client tool's outputs is held until the run has asked for the approval
    // (as when the worker is faster than that reply): the late reply must not take the
    // approval's question off the page.
    let release;
    const held = new Promise((resolve) => (release = resolve));
    await page.route("**/tool_outputs", async (route) => {
      const response = await route.fetch();
      await held;
      await route.fulfill({ response });
    });
    await page.goto(`${base}/?thread=${thread}#token=${token}`);
    await page.locator("textarea").fill("read my notes");
    await page.locator("textarea").press("Enter");
    const outputs = page.locator('[data-action="tool_outputs"]');
    await outputs.locator("input").fill("the notes", { timeout: 30000 });
    await outputs.locator("button").click();
    const approve = page.locator('[data-action="approval"] button', { hasText: "Approve" });
    await approve.waitFor({ timeout: 30000 });
    const answered = page.waitForResponse((r) => r.url().endsWith("/tool_outputs"));
    release();
    await (await answered).finished();
    await approve.click({ timeout: 30000 });
    await page.waitForFunction(
      () => document.querySelector('[data-role="assistant"]')?.dataset.status === "completed",
      null,
      { timeout: 30000 },
    );
    const reply = page.locator('[data-role="assistant"]');
    console.log(JSON.stringify({ text: await reply.textContent(), tools: await reply.locator(".tool").count() }));
  } finally {
    await browser.close();
  }
  process.exit(0);
}

const [base, token, screenshot] = process.argv.slice(2);
const lines = createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once("line", resolve));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox"],
});
const result = {};
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 640 } });
  const errors = [];
  page.on("pageerror", (err) => errors.push(String(err)));
  // The page's console and failed requests, for a failing run's log.
  page.on("console", (m) => console.error(`console ${m.type()}: ${m.text()}`));
  page.on("requestfailed", (r) => console.error(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  // Every stream URL the page opens: none may carry the long-lived token.
  const streamUrls = [];
  page.on("request", (r) => r.url().includes("/stream?") && streamUrls.push(r.url()));
  await page.goto(`${base}/#token=${token}`);
  const replies = page.locator('[data-role="assistant"]');

  const sendAndWaitForStream = async (text) => {
    const before = await replies.count();
    await page.locator("textarea").fill(text);
    await page.locator("textarea").press("Enter");
    await page
      .waitForFunction(
      (n) => {
        const all = document.querySelectorAll('[data-role="assistant"]');
        return all.length > n && all[all.length - 1].textContent.length >= 20;
      },
      before,
      { timeout: 30000 },
    )
      .catch(async (err) => {
        console.error(`status: ${await page.locator("#status").textContent()}`);
        console.error(`messages: ${await page.locator("#messages").innerHTML()}`);
        throw err;
      });
  };
  // The text of reply number `count` (from 1), once it has ended with `status`.
  const lastReply = async (status, count) => {
    await page.waitForFunction(
      ([wanted, n]) => {
        const all = document.querySelectorAll('[data-role="assistant"]');
        return all.length === n && all[n - 1].dataset.status === wanted;
      },
      [status, count],
      { timeout: 60000 },
    );
    return replies.nth(count - 1).textContent();
  };

  await sendAndWaitForStream("hello page");
  console.log("STREAMING");
  await nextLine();
  result.first = await lastReply("completed", 1);

  await sendAndWaitForStream("survive a reload");
  await page.reload();
  result.second = await lastReply("completed", 2);
  result.threadInUrl = new URL(page.url()).searchParams.get("thread");
  result.threads = await page.locator("#threads li").count();
  await page.screenshot({ path: screenshot });

  await sendAndWaitForStream("cancel me");
  await page.locator("#cancel").click();
  result.cancelled = (await lastReply("cancelled", 3)).length;
  result.textareas = await page.locator("textarea").count();
  result.errors = errors;
  result.streamUrls = streamUrls.length;
  result.longTokenInStreamUrls = streamUrls.filter((u) => u.includes(token)).length;

  const refused = await browser.newPage();
  await refused.goto(`${base}/#token=not-a-token`);
  await refused.locator("#signin").waitFor({ state: "visible", timeout: 10000 });
  result.signInShown = true;
  // A token that was good and has expired: the same sign-in prompt.
  const expired = await browser.newPage();
  await expired.goto(`${base}/#token=${process.env.EXPIRED_TOKEN}`);
  await expired.locator("#signin").waitFor({ state: "visible", timeout: 10000 });
  result.expiredSignInShown = true;
} finally {
  lines.close();
  await browser.close();
}
console.log(JSON.stringify(result));
