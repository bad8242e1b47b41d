// The Next.js example (examples/nextjs) in Chromium (Debian's, driven by playwright-core), as
// a user uses it.
//
// Usage: node nextjs_test.mjs APP
// 1. Opens APP (a new thread goes into the URL), sends "slow please"; once the answer streams,
//    reloads the page and waits for the answer to complete (replayed: `resume`).
// 2. Sends "tools please": the agent asks the browser for `get_location` (a client tool,
//    answered in onToolCall), then calls `get_weather`, which waits for approval; clicks
//    Approve and waits for the answer.
// 3. Reloads once more: the history is loaded from Spool.
// Prints one JSON line: the thread, what the page showed after each step, the page's errors.
import { chromium } from "playwright-core";

const [app] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox"],
});
const TIMEOUT = 30000;

try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (err) => errors.push(String(err)));
  page.on("console", (message) => {
    if (message.type() === "error") console.error(`console: ${message.text()}`);
  });
  const input = page.getByLabel("Message");
  const status = page.getByTestId("status");
  const ready = () => page.waitForFunction(
    () => document.querySelector("[data-testid=status]")?.textContent.trim() === "ready",
    null,
    { timeout: TIMEOUT },
  );
  const shown = () => page.evaluate(() =>
    [...document.querySelectorAll("[data-testid=messages] > li")].map((li) => ({
      role: li.dataset.role,
      text: [...li.querySelectorAll("[data-testid=text]")].map((p) => p.textContent).join(""),
      tools: [...li.querySelectorAll("[data-testid=tool]")].map((t) => [t.dataset.tool, t.dataset.state]),
    })),
  );

  await page.goto(app);
  await input.waitFor({ state: "visible", timeout: TIMEOUT });
  const thread = new URL(page.url()).searchParams.get("thread");

  // 1. Streaming, then a reload mid-answer.
  await input.fill("slow please");
  await input.press("Enter");
  await page.waitForFunction(
    () => document.querySelector("li[data-role=assistant] [data-testid=text]")?.textContent.length > 0,
    null,
    { timeout: TIMEOUT },
  );
  const beforeReload = (await shown()).at(-1).text;
  await page.reload();
  await input.waitFor({ state: "visible", timeout: TIMEOUT });
  const sameThread = new URL(page.url()).searchParams.get("thread") === thread;
  await page.waitForFunction(
    () => [...document.querySelectorAll("[data-testid=text]")].some((p) => p.textContent.endsWith("reload.")),
    null,
    { timeout: TIMEOUT },
  );
  await ready();
  const afterReload = await shown();

  // 2. A client tool, then an approval.
  await input.fill("tools please");
  await input.press("Enter");
  const approve = page.getByRole("button", { name: "Approve" });
  await approve.waitFor({ state: "visible", timeout: TIMEOUT });
  await approve.click();
  await page.waitForFunction(
    () => [...document.querySelectorAll("[data-testid=text]")].some((p) => p.textContent === "All done."),
    null,
    { timeout: TIMEOUT },
  );
  await ready();
  const afterTools = await shown();

  // 3. The history, loaded from Spool.
  await page.reload();
  await page.waitForFunction(
    () => document.querySelectorAll("[data-testid=messages] > li").length >= 4,
    null,
    { timeout: TIMEOUT },
  );
  const history = await shown();
  console.log(JSON.stringify({ thread, sameThread, beforeReload, afterReload, afterTools, history, errors, status: await status.textContent() }));
} finally {
  await browser.close();
}
