// llmroute's live page: asks /admin/live/data every second with the admin key in the
// Authorization header (never in a URL) and draws what it holds with inline SVG. No library.
"use strict";
(function () {
  const STORE = "llmroute.live.key";
  const DATA = "/admin/live/data";
  const POLL_MS = 1000;
  const WINDOW_S = 60; // rates and shares over this many seconds
  const SVG = "http://www.w3.org/2000/svg";
  const REASONS = ["first", "hedge", "failover", "continuation"];
  const CAUSES = ["error", "timeout", "rate_limited", "interrupted"];
  const COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2",
    "#ff9da6", "#9d755d", "#bab0ac", "#eeca3b"];
  const BREAKER = { closed: "#2e8540", "half-open": "#c77c02", open: "#c62828" };

  let samples = []; // the gateway's samples, oldest first
  let seq = 0;
  let replica = null; // the gateway process whose samples these are
  let latest = null; // the last answer (routes, usage, objectives)
  let timer = null;
  let generation = 0; // a new key (or a forgotten one) ends the polls of the one before

  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) node.setAttribute(k, String(v));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }

  const ms = (s) => (s === null || s === undefined ? "–" : (s * 1000).toFixed(0));
  const pct = (x) => (x === null || x === undefined ? "–" : (x * 100).toFixed(0) + "%");
  const num = (x) => (x === null || x === undefined ? "–" : Number(x).toLocaleString("en"));

  function status(state, text, extra) {
    const node = $("status");
    node.dataset.state = state;
    node.textContent = text;
    for (const [k, v] of Object.entries(extra || {})) node.dataset[k] = String(v);
  }

  function signedIn(on) {
    $("login").hidden = on;
    $("logout").hidden = !on;
  }

  // -- polling ------------------------------------------------------------------------------

  async function poll(gen) {
    const key = sessionStorage.getItem(STORE);
    if (!key || gen !== generation) return;
    let answer;
    try {
      answer = await fetch(DATA, {
        headers: { Authorization: "Bearer " + key, "x-llmroute-live-since": String(seq) },
        cache: "no-store",
        credentials: "omit",
      });
    } catch (err) {
      status("error", "The gateway cannot be reached; retrying.");
      timer = setTimeout(() => poll(gen), POLL_MS * 2);
      return;
    }
    if (gen !== generation) return;
    if (answer.status === 401 || answer.status === 403) {
      sessionStorage.removeItem(STORE);
      signedIn(false);
      status("refused", answer.status === 401
        ? "Refused (401): that is not a key of this gateway."
        : "Refused (403): that key is not an admin key.", { status: answer.status });
      $("main").replaceChildren();
      return;
    }
    if (!answer.ok) {
      status("error", "The gateway answered " + answer.status + "; retrying.");
      timer = setTimeout(() => poll(gen), POLL_MS * 2);
      return;
    }
    const data = await answer.json();
    if (data.replica !== replica) {
      // Another process (a restart, or another --workers worker): its samples, from its start.
      replica = data.replica;
      if (seq !== 0) {
        samples = [];
        seq = 0;
        timer = setTimeout(() => poll(gen), 0);
        return;
      }
    }
    samples.push(...data.samples);
    if (samples.length > data.keep) samples = samples.slice(samples.length - data.keep);
    seq = data.seq;
    latest = data;
    render();
    status("live", "Live: " + new Date().toLocaleTimeString(), { seq: seq, status: 200 });
    timer = setTimeout(() => poll(gen), POLL_MS);
  }

  function start() {
    generation += 1;
    clearTimeout(timer);
    samples = [];
    seq = 0;
    replica = null;
    signedIn(true);
    status("connecting", "Connecting…");
    poll(generation);
  }

  // -- figures from the samples ------------------------------------------------------------

  function windowStart(last) {
    for (const s of samples) if (s.t >= last.t - WINDOW_S) return s;
    return samples[0];
  }

  function delta(now, then) {
    const a = now || 0;
    const b = then || 0;
    return a >= b ? a - b : a; // a counter that went back: the process restarted
  }

  function attempts(target, reason, outcome) {
    const byReason = (target && target.attempts) || {};
    let total = 0;
    for (const [r, outcomes] of Object.entries(byReason)) {
      if (reason && r !== reason) continue;
      for (const [o, v] of Object.entries(outcomes)) {
        if (outcome && o !== outcome) continue;
        if (Array.isArray(outcome) && !outcome.includes(o)) continue;
        total += v;
      }
    }
    return total;
  }

  function causes(target) {
    const out = {};
    for (const cause of CAUSES) out[cause] = attempts(target, null, cause);
    return out;
  }

  function requests(route) {
    let total = 0, live = 0;
    for (const [k, v] of Object.entries((route && route.requests) || {})) {
      total += v;
      if (k.endsWith("/live")) live += v;
    }
    return { total, live };
  }

  function quantile(now, then, q) {
    // A quantile of the observations between two samples of a cumulative histogram (counts
    // in the order of the answer's `ttft_le`, the buckets' upper bounds), interpolated within
    // its bucket as Prometheus's histogram_quantile does.
    const les = (latest && latest.ttft_le) || [];
    if (!now || !les.length) return null;
    const total = delta(now[les.length - 1], then && then[les.length - 1]);
    if (!total) return null;
    const rank = q * total;
    let lower = 0, below = 0;
    for (let i = 0; i < les.length; i += 1) {
      const bound = les[i] === "+Inf" ? Infinity : Number(les[i]);
      const count = delta(now[i], then && then[i]);
      if (count >= rank) {
        if (bound === Infinity) return lower;
        return lower + (bound - lower) * ((rank - below) / Math.max(count - below, 1e-9));
      }
      lower = bound;
      below = count;
    }
    return lower;
  }

  function before(index, seconds) {
    // The sample `seconds` before samples[index] (or the oldest one).
    const t = samples[index].t - seconds;
    let k = index;
    while (k > 0 && samples[k - 1].t >= t) k -= 1;
    return samples[k];
  }

  // -- drawing ------------------------------------------------------------------------------

  function lines(series, width, height, yMax, opts) {
    // series: [{points: [[t, v]], color, dash, width, label}]; t in seconds (wall clock).
    const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    const left = opts.axis ? 34 : 1, bottom = opts.axis ? 12 : 1;
    const t1 = samples.length ? samples[samples.length - 1].t : 0;
    const t0 = Math.min(samples.length ? samples[0].t : t1, t1 - 30);
    const x = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * (width - left - 2);
    const top = opts.axis ? 8 : 2;
    const y = (v) => height - bottom - (Math.min(v, yMax) / yMax) * (height - bottom - top);
    if (opts.axis) {
      for (const frac of [0, 0.5, 1]) {
        const v = yMax * frac;
        box.append(svg("line", { x1: left, x2: width, y1: y(v), y2: y(v), stroke: "#e6e9ed" }));
        const label = svg("text", { x: left - 3, y: y(v) + 3, "text-anchor": "end" });
        label.textContent = (v * 1000).toFixed(0);
        box.append(label);
      }
      const span = svg("text", { x: left, y: height - 1 });
      span.textContent = `ms · last ${Math.round(t1 - t0)} s`;
      box.append(span);
    }
    for (const s of series) {
      let d = "";
      let pen = false;
      for (const [t, v] of s.points) {
        if (v === null || v === undefined) { pen = false; continue; }
        d += (pen ? "L" : "M") + x(t).toFixed(1) + " " + y(v).toFixed(1);
        pen = true;
      }
      if (!d) continue;
      const path = svg("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width || 1.5 });
      if (s.dash) path.setAttribute("stroke-dasharray", s.dash);
      if (s.label) path.setAttribute("data-series", s.label);
      box.append(path);
    }
    return box;
  }

  function strip(name, width, height) {
    // The breaker's state in every sample: one bar per sample, coloured by state.
    const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}` });
    const n = samples.length;
    if (!n) return box;
    const w = width / Math.max(n, 60);
    samples.forEach((s, i) => {
      const target = s.targets[name];
      const state = target ? target.breaker : null;
      if (!state) return;
      box.append(svg("rect", {
        x: width - (n - i) * w, y: 0, width: Math.max(w, 0.6), height, fill: BREAKER[state] || "#999",
      }));
    });
    return box;
  }

  function routeSection(name, route, last, first) {
    const targets = route.targets;
    const now = last.routes[name] || {};
    const then = first.routes[name] || {};
    const dt = Math.max(1, last.t - first.t);
    const req = requests(now), req0 = requests(then);
    const liveReq = delta(req.live, req0.live);
    let attemptsDelta = 0, winsTotal = 0;
    const rows = targets.map((t, i) => {
      const a = last.targets[t] || {}, b = first.targets[t] || {};
      const wins = delta(attempts(a, null, "won"), attempts(b, null, "won"));
      attemptsDelta += delta(attempts(a), attempts(b));
      winsTotal += wins;
      return { t, i, a, b, wins };
    });
    const amplification = liveReq ? attemptsDelta / liveReq : null;
    const cacheNow = (now.cache && (now.cache.cache || 0) + (now.cache.shared || 0)) || 0;
    const cacheThen = (then.cache && (then.cache.cache || 0) + (then.cache.shared || 0)) || 0;
    const cacheDelta = delta(cacheNow, cacheThen);
    const reqDelta = delta(req.total, req0.total);

    const callers = [0.5, 0.95, 0.99].map((q) =>
      quantile(now.ttft_buckets, then.ttft_buckets, q));
    const figure = (field, label, value, shown, title) => el("span",
      { class: "figure", "data-field": field, "data-value": value, title },
      label + " ", el("b", {}, shown));
    const head = el("div", { class: "route-head" },
      el("h2", {}, name),
      el("span", { class: "dim" }, route.policy + " · " + targets.length + " targets"),
      figure("rps", "req/s", (reqDelta / dt).toFixed(2), (reqDelta / dt).toFixed(2)),
      figure("requests", "requests", req.total, num(req.total), "since the start"),
      figure("caller_p95", "callers' TTFT p50 · p95 · p99",
        callers[1] === null ? "" : callers[1].toFixed(4), callers.map(ms).join(" · ") + " ms",
        "time to first token as the gateway's callers got it (hedges, failovers, cache hits "
        + "included), last " + WINDOW_S + " s, from the histogram's buckets"),
      figure("amplification", "attempts per request", amplification === null ? "" : amplification.toFixed(3),
        amplification === null ? "–" : amplification.toFixed(2),
        "attempts of this route's targets per live request, last " + WINDOW_S + " s"),
      figure("hedges_fired", "hedges", now.hedges_fired || 0,
        num(now.hedges_fired || 0) + " (+" + delta(now.hedges_fired, then.hedges_fired) + ")",
        "hedges started since the start (+ in the last " + WINDOW_S + " s)"),
      figure("hedges_won", "won", now.hedges_won || 0, num(now.hedges_won || 0)),
      figure("hedges_denied", "denied by budget", now.hedges_denied || 0, num(now.hedges_denied || 0)),
      figure("continuations", "continued", now.continuations || 0, num(now.continuations || 0)),
      figure("cache_hits", "cache hits", cacheNow,
        num(cacheNow) + (reqDelta ? " (" + pct(cacheDelta / reqDelta) + " now)" : ""),
        "answers with no upstream request: each saved one upstream call and its wait"),
    );

    // One chart per route: every target's p95 over time.
    let yMax = 0.05;
    for (const s of samples) for (const t of targets) {
      const v = s.targets[t] && s.targets[t].p95;
      if (v) yMax = Math.max(yMax, v);
    }
    yMax *= 1.1;
    const color = (i) => COLORS[i % COLORS.length];
    const dash = (i) => (i >= COLORS.length ? "4 2" : null);
    const p95chart = lines(rows.map((r) => ({
      points: samples.map((s) => [s.t, s.targets[r.t] ? s.targets[r.t].p95 : null]),
      color: color(r.i), dash: dash(r.i), label: r.t,
    })), 640, 170, yMax, { axis: true });
    const legend = el("div", { class: "legend" }, ...rows.map((r) => {
      const sw = el("span", { class: "swatch" });
      sw.style.background = color(r.i);
      return el("span", {}, sw, r.t);
    }));

    const table = el("table", { class: "targets" },
      el("tr", {},
        ...["target", "breaker", "history", "share", "p50", "p95", "p99", "TTFT (p50 · p95 · p99)",
          "in flight", "first", "hedge", "failover", "cont.", "other", "wins", "errors", "n"].map((h) => el("th", {}, h))));
    const sparkMax = Math.max(0.05, ...samples.flatMap((s) => targets.map((t) =>
      (s.targets[t] && s.targets[t].p99) || 0))) * 1.05;
    for (const r of rows) {
      const a = r.a, b = r.b;
      const share = winsTotal ? r.wins / winsTotal : null;
      const bar = el("span", { class: "bar" });
      bar.style.width = Math.round((share || 0) * 60) + "px";
      const byReason = REASONS.map((reason) => {
        const n = delta(attempts(a, reason), attempts(b, reason));
        const won = delta(attempts(a, reason, "won"), attempts(b, reason, "won"));
        return el("td", { "data-field": "attempts_" + reason, "data-value": attempts(a, reason),
          title: `${reason}: ${attempts(a, reason)} since the start, ${won} won of ${n} in the last ${WINDOW_S} s` },
          n ? `${n} · ${won}✓` : "–");
      });
      // Attempts made for another reason: race, retry, explore (a re-measure).
      const others = Object.keys(Object.assign({}, b.attempts || {}, a.attempts || {}))
        .filter((reason) => !REASONS.includes(reason));
      const otherN = others.reduce((s, reason) => s + delta(attempts(a, reason), attempts(b, reason)), 0);
      const otherWon = others.reduce((s, reason) =>
        s + delta(attempts(a, reason, "won"), attempts(b, reason, "won")), 0);
      byReason.push(el("td", { "data-field": "attempts_other",
        "data-value": others.reduce((s, reason) => s + attempts(a, reason), 0),
        title: others.map((reason) => `${reason}: ${delta(attempts(a, reason), attempts(b, reason))}`).join(", ")
          + ` in the last ${WINDOW_S} s` },
        otherN ? `${otherN} · ${otherWon}✓` : "–"));
      const errNow = causes(a), errThen = causes(b);
      const errParts = CAUSES.map((c) => [c, delta(errNow[c], errThen[c])]).filter(([, v]) => v);
      const errTotal = CAUSES.reduce((s, c) => s + errNow[c], 0);
      const spark = lines(["p50", "p95", "p99"].map((q, k) => ({
        points: samples.map((s) => [s.t, s.targets[r.t] ? s.targets[r.t][q] : null]),
        color: ["#9ecae9", "#4c78a8", "#1d3557"][k], width: 1.2, label: q,
      })), 150, 24, sparkMax, { axis: false });
      const state = a.breaker || "closed";
      const opened = samples.filter((s, i) => i > 0 && s.targets[r.t] && s.targets[r.t].breaker === "open"
        && (!samples[i - 1].targets[r.t] || samples[i - 1].targets[r.t].breaker !== "open")).length;
      table.append(el("tr", { "data-target": r.t },
        el("td", { class: "name" }, el("span", { class: "swatch" }), r.t),
        el("td", { "data-field": "breaker", "data-value": state },
          el("span", { class: "state " + state }, state)),
        el("td", { class: "strip", title: `opened ${opened}× in the samples shown` }, strip(r.t, 90, 10)),
        el("td", { "data-field": "share", "data-value": share === null ? "" : share.toFixed(4),
          title: `answers won in the last ${WINDOW_S} s: ${r.wins}` }, bar, pct(share)),
        el("td", { "data-field": "p50", "data-value": a.p50 ?? "" }, ms(a.p50)),
        el("td", { "data-field": "p95", "data-value": a.p95 ?? "" }, ms(a.p95)),
        el("td", { "data-field": "p99", "data-value": a.p99 ?? "" }, ms(a.p99)),
        el("td", { class: "spark" }, spark),
        el("td", { "data-field": "in_flight", "data-value": a.in_flight ?? 0 }, num(a.in_flight ?? 0)),
        ...byReason,
        el("td", { "data-field": "wins", "data-value": attempts(a, null, "won") }, num(r.wins)),
        el("td", { "data-field": "errors", "data-value": errTotal,
          class: errParts.length ? "errors" : "", title: "since the start: " + CAUSES.map((c) => c + " " + errNow[c]).join(", ") },
          errParts.length ? errParts.map(([c, v]) => `${c} ${v}`).join(", ") : "–"),
        el("td", { "data-field": "n", "data-value": a.n ?? 0 }, num(a.n ?? 0)),
      ));
      table.lastChild.querySelector(".swatch").style.background = color(r.i);
    }
    // The callers' TTFT over time: each point over the WINDOW_S before it.
    const pairs = samples.map((smp, i) => [smp.t, smp.routes[name], before(i, WINDOW_S).routes[name]]);
    const callerSeries = [0.5, 0.95, 0.99].map((q, k) => ({
      points: pairs.map(([t, r, o]) => [t, r ? quantile(r.ttft_buckets, o && o.ttft_buckets, q) : null]),
      color: ["#9ecae9", "#4c78a8", "#1d3557"][k], width: 1.5, label: "callers-p" + q * 100,
    }));
    let callerMax = 0.05;
    for (const s of callerSeries) for (const [, v] of s.points) if (v) callerMax = Math.max(callerMax, v);
    const callerChart = lines(callerSeries, 420, 170, callerMax * 1.1, { axis: true });
    const callerLegend = el("div", { class: "legend" }, ...["p50", "p95", "p99"].map((q, k) => {
      const sw = el("span", { class: "swatch" });
      sw.style.background = ["#9ecae9", "#4c78a8", "#1d3557"][k];
      return el("span", {}, sw, q);
    }));
    return el("section", { class: "route", "data-route": name },
      head,
      el("div", { class: "charts" },
        el("div", {}, el("h3", {}, "p95 TTFT by target"), p95chart, legend),
        el("div", {}, el("h3", {}, `Callers' TTFT (each point: the ${WINDOW_S} s before it)`),
          callerChart, callerLegend)),
      el("h3", {}, `Targets (rates, shares, attempts · wins and errors: last ${WINDOW_S} s)`),
      table);
  }

  function usagePanel(data) {
    const keys = Object.entries(data.usage || {});
    if (!keys.length) return null;
    const table = el("table", { class: "usage" }, el("tr", {},
      ...["key", "requests", "errors", "prompt tokens", "completion tokens", "cache hits",
        "spend", "hedged", "this minute"].map((h) => el("th", {}, h))));
    for (const [name, u] of keys) {
      const limits = u.limits;
      const minute = limits ? [limits.rpm ? `${limits.requests_this_minute}/${limits.rpm} req` : null,
        limits.tpm ? `${num(limits.tokens_this_minute)}/${num(limits.tpm)} tok` : null]
        .filter(Boolean).join(", ") : "";
      table.append(el("tr", { "data-key": name },
        el("td", { class: "name" }, name + (u.revoked ? " (revoked)" : "")),
        el("td", {}, num(u.requests)), el("td", {}, num(u.errors)),
        el("td", {}, num(u.prompt_tokens)), el("td", {}, num(u.completion_tokens)),
        el("td", {}, num(u.cache_hits)),
        el("td", {}, u.spend_nanos ? `$${u.spend_usd}` : "–"),
        el("td", {}, u.hedge_share != null ? `${(u.hedge_share * 100).toFixed(0)}%` : "–"),
        el("td", {}, minute || "–")));
    }
    return el("div", {}, el("h3", {}, "Usage per key"), table);
  }

  function sloPanel(data) {
    const series = data.slo || [];
    const body = el("table", { class: "slo" }, el("tr", {},
      ...["key", "route", "objective", "requests", "met", "burn 5m", "burn 1h", "burn 6h"].map((h) => el("th", {}, h))));
    for (const s of series) {
      const burn = (w) => {
        const v = s.burn_rate[w];
        return el("td", { class: v !== null && v > 1 ? "burn-high" : "" }, v === null ? "–" : v.toFixed(2));
      };
      body.append(el("tr", { "data-slo": s.key + "/" + s.route },
        el("td", { class: "name" }, s.key), el("td", {}, s.route === "*" ? "every route" : s.route),
        el("td", {}, `p${s.objective.percentile} ≤ ${s.objective.ttft_ms} ms`),
        el("td", {}, num(s.requests)), el("td", {}, s.requests ? pct(s.met / s.requests) : "–"),
        burn("5m"), burn("1h"), burn("6h")));
    }
    return el("div", {}, el("h3", {}, "Latency objectives"),
      series.length ? body : el("p", { class: "dim" }, "No objective configured (docs/gateway.md, Latency objectives)."));
  }

  function tiersPanel(last) {
    const rows = last.tiers || [];
    if (!rows.length && !Object.keys((latest && latest.tiered) || {}).length) return null;
    const table = el("table", { class: "tiers" }, el("tr", {},
      ...["model", "class", "tier", "reason", "decisions"].map((h) => el("th", {}, h))));
    for (const r of rows) {
      table.append(el("tr", {}, el("td", { class: "name" }, r.model), el("td", {}, r.class),
        el("td", {}, r.tier), el("td", {}, r.reason), el("td", {}, num(r.n))));
    }
    return el("div", {}, el("h3", {}, "Tier decisions"), table);
  }

  function render() {
    if (!samples.length || !latest) return;
    const last = samples[samples.length - 1];
    const first = windowStart(last);
    $("window").textContent = String(WINDOW_S);
    const sections = Object.entries(latest.routes).map(([name, route]) =>
      routeSection(name, route, last, first));
    const panels = el("div", { class: "panels" }, usagePanel(latest), sloPanel(latest), tiersPanel(last));
    $("main").replaceChildren(...sections, panels);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key").value.trim();
      $("key").value = "";
      if (!key) return;
      sessionStorage.setItem(STORE, key);
      start();
    });
    $("logout").addEventListener("click", () => {
      sessionStorage.removeItem(STORE);
      generation += 1;
      clearTimeout(timer);
      signedIn(false);
      status("signed-out", "Give an admin key to watch.");
      $("main").replaceChildren();
    });
    if (sessionStorage.getItem(STORE)) start();
    else signedIn(false);
  });
})();
