// The live view: every two seconds, the table from data.json and each
// chart's SVG, drawn by the daemon. A token given in the page's fragment
// (view/#token=TOKEN, which the browser never sends to the daemon as part
// of the address) goes with every request, and the table then shows
// sources' paths instead of their hashes.
"use strict";

const every = 2000;
const token = new URLSearchParams(location.hash.slice(1)).get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};

function get(path) {
  return fetch(path, { headers, cache: "no-store" }).then((r) => {
    if (!r.ok) throw new Error(path + ": " + r.status + " " + r.statusText);
    return r;
  });
}

function human(n) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function row(cells, cls) {
  const tr = document.createElement("tr");
  if (cls) tr.className = cls;
  for (const c of cells) {
    const td = document.createElement("td");
    if (typeof c === "number") td.className = "num";
    td.textContent = c;
    tr.append(td);
  }
  return tr;
}

function table(d) {
  const st = d.status;
  document.getElementById("clients").textContent = st.clients;
  document.getElementById("read").textContent = human(st.read_bytes);
  document.getElementById("served").textContent = human(st.served_bytes);
  const c = st.cache;
  document.getElementById("cache").textContent =
    `${human(c.bytes)} of ${human(c.budget)}, ${c.items} items, hit rate ${d.cache_hit_rate.toFixed(1)}% now, ${c.evictions} evictions`;
  document.querySelector("#devices tbody").replaceChildren(
    ...(d.devices || []).map((v) => row([v.name, Number(v.mb_per_sec.toFixed(1)), v.reads_in_flight, human(v.bytes)])));
  const rows = [];
  for (const g of st.groups || []) {
    let what = `${g.records} records`;
    if ((g.jobs || []).length > 1 || g.shared > 0) what += `, ${g.jobs.length} jobs sharing, ${g.saved} reads avoided`;
    rows.push(row([g.source, what, "", "", "", "", "", ""], "group"));
    for (const j of g.jobs || []) {
      const now = d.rates[j.id];
      rows.push(row(["", j.id, j.subset, j.epoch, j.position, now === undefined ? "" : Math.round(now),
        Math.round(j.samples_per_sec), j.transform || ""], "job"));
    }
  }
  if (rows.length === 0) rows.push(row(["no jobs"]));
  document.querySelector("#jobs tbody").replaceChildren(...rows);
  return d;
}

function chart(fig) {
  return get("chart/" + fig.dataset.chart + ".svg").then((r) => r.text()).then((text) => {
    const svg = new DOMParser().parseFromString(text, "image/svg+xml").documentElement;
    if (svg.nodeName !== "svg") throw new Error(fig.dataset.chart + ": not an SVG");
    fig.replaceChildren(document.importNode(svg, true));
  });
}

function refresh() {
  const state = document.getElementById("state");
  Promise.all([get("data.json").then((r) => r.json()).then(table), ...[...document.querySelectorAll(".chart")].map(chart)])
    .then(([d]) => {
      state.className = "";
      state.textContent = `updated ${new Date().toLocaleTimeString()}; ${d.samples} samples, one every ${d.every} s` +
        (token ? "; paths shown (token)" : "; sources hashed (no token)");
    })
    .catch((e) => {
      state.className = "failed";
      state.textContent = "the daemon did not answer: " + e.message;
    })
    .finally(() => setTimeout(refresh, every));
}

refresh();
