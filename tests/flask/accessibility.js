// The basics of accessibility a page can get wrong, found in the page by
// WebDriver (tests/flask/chromium.py accessibility_problems): controls without
// a label, buttons and links without a name, charts without a title, and text
// (chart labels included) whose contrast with what is behind it is under WCAG
// AA's 4.5:1 (3:1 for large text). Returns one line per problem.
const problems = new Set();

const rgba = (text) => {
  const n = text.match(/[\d.]+/g).map(Number);
  return [n[0], n[1], n[2], n.length > 3 ? n[3] : 1];
};

const behind = (element) => {
  for (let e = element; e; e = e.parentElement) {
    const colour = rgba(getComputedStyle(e).backgroundColor);
    if (colour[3] > 0) return colour;
  }
  return [255, 255, 255, 1];
};

const luminance = (colour) => {
  const [r, g, b] = colour.slice(0, 3).map((v) => {
    v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
};

const ratio = (fg, bg) => {
  const seen = [0, 1, 2].map((i) => fg[i] * fg[3] + bg[i] * (1 - fg[3]));
  const [high, low] = [luminance(seen), luminance(bg)].sort((x, y) => y - x);
  return (high + 0.05) / (low + 0.05);
};

const name = (e) =>
  e.tagName.toLowerCase() + (typeof e.className === "string" && e.className ? "." + e.className : "");

for (const control of document.querySelectorAll("input:not([type=hidden]), select, textarea")) {
  if (!(control.labels && control.labels.length) && !control.getAttribute("aria-label")) {
    problems.add("unlabelled " + name(control) + " " + control.name);
  }
}
for (const e of document.querySelectorAll("button, a[href]")) {
  if (!(e.textContent.trim() || e.getAttribute("aria-label"))) {
    problems.add("no name: " + e.outerHTML.slice(0, 80));
  }
}
for (const svg of document.querySelectorAll("svg[role=img]")) {
  if (!(svg.getAttribute("aria-labelledby") || svg.querySelector("title"))) {
    problems.add("a chart with no title: " + svg.id);
  }
}

const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
const checked = new Set();
while (walker.nextNode()) {
  const element = walker.currentNode.parentElement;
  if (!walker.currentNode.textContent.trim() || checked.has(element) || element.closest("title")) continue;
  checked.add(element);
  const style = getComputedStyle(element);
  if (style.display === "none" || style.visibility === "hidden") continue;
  const chart = element.closest("svg");
  const size = parseFloat(style.fontSize);
  const large = size >= 24 || (parseInt(style.fontWeight, 10) >= 700 && size >= 18.66);
  const found = ratio(rgba(chart ? style.fill : style.color), behind(chart || element));
  if (found < (large ? 3 : 4.5)) {
    const text = element.textContent.trim().slice(0, 40);
    problems.add(name(element) + " text contrast " + found.toFixed(2) + ":1 (" + text + ")");
  }
}
return [...problems];
