// Takes the README's screenshots of each studio page over one run, in headless Chromium (Debian's, driven by the
// playwright-core that `cargo xtask setup` installs), 1280×800 each:
//
//   trinity studio --root checkpoints            # from the repository root, so the Config page offers examples/
//   node docs/studio/screenshots.cjs http://127.0.0.1:8765/ quickstart/smollm2-addition docs/studio \
//     rollout/reward_mean eval/addition-eval/accuracy
//
// Arguments: the studio's address, the run (project/name as the Runs page lists it), the folder to write the PNGs
// to, and the two metrics the Curves page draws. The Config page opens examples/quickstart/quickstart.yaml and
// validates it with two mistakes written in (a negative learning rate, a misspelt key) so that each error shows at
// its line. TRINITY_PLAYWRIGHT_CORE overrides where playwright-core is (default: <deps>/npm/node_modules, where
// <deps> is TRINITY_DEPS_DIR or .deps), CHROMIUM where the browser is (default /usr/bin/chromium).
"use strict";
const os = require("os");
const path = require("path");

const [url, run, out, metricA, metricB] = process.argv.slice(2);
if (!url || !run || !out || !metricB) {
  console.error("usage: node docs/studio/screenshots.cjs STUDIO_URL RUN OUT_DIR METRIC METRIC");
  process.exit(2);
}
const deps = process.env.TRINITY_DEPS_DIR || path.join(__dirname, "..", "..", ".deps");
const { chromium } = require(process.env.TRINITY_PLAYWRIGHT_CORE || path.join(deps, "npm/node_modules/playwright-core"));
const page_ = (hash) => `${url.replace(/\/$/, "")}/#/${hash}`;

(async () => {
  const context = await chromium.launchPersistentContext(path.join(os.tmpdir(), "trinity-studio-shots"), {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"],
    viewport: { width: 1280, height: 800 },
  });
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(20000);
  const shot = async (name) => {
    const file = path.join(out, `${name}.png`);
    await page.screenshot({ path: file });
    console.log(file);
  };
  try {
    await page.goto(page_("runs"));
    await page.locator(`tr[data-run="${run}"]`).waitFor();
    await shot("runs");

    const metrics = [metricA, metricB];
    await page.goto(page_(`curves?${new URLSearchParams([["run", run], ...metrics.map((m) => ["metric", m])])}`));
    for (const metric of metrics) await page.waitForSelector(`.chart[data-metric="${metric}"]`);
    await shot("curves");

    await page.goto(page_(`rollouts?${new URLSearchParams({ run })}`));
    await page.waitForSelector('main[data-ready="rollouts"] .rollout');
    await shot("rollouts");
    // The filter as a person sets it: rewards of 1 only.
    await page.fill("#reward-min", "1");
    await page.click("#apply-filter");
    await page.waitForFunction(() => [...document.querySelectorAll(".rollout")].every((r) => Number(r.dataset.reward) >= 1)
      && document.querySelectorAll(".rollout").length > 0);
    await shot("rollouts-filtered");

    await page.goto(page_("config"));
    await page.waitForSelector('main[data-ready="config"]');
    await page.selectOption("#example", { label: "quickstart/quickstart.yaml" });
    await page.waitForFunction(() => document.querySelector("#config-text").value.includes("project: quickstart"));
    const text = (await page.inputValue("#config-text")).replace("lr: 1e-5", "lr: -1e-5").replace("batch_size: 4", "batch_sise: 4");
    await page.fill("#config-text", text);
    await page.click("#validate");
    await page.waitForSelector("#problems li");
    // Back to the top, where both marked lines are.
    await page.$eval("#config-text", (t) => { t.scrollTop = 0; t.dispatchEvent(new Event("scroll")); });
    await shot("config");

    await page.goto(page_("plugins"));
    await page.waitForSelector('main[data-ready="plugins"]');
    await shot("plugins");
  } finally {
    await context.close();
  }
})().catch((error) => {
  console.error(`screenshots: ${error.stack || error}`);
  process.exit(1);
});
