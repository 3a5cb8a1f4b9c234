// The ursa dashboard: polls /api/status and draws it. No libraries, no build.
"use strict";

(function () {
  const REFRESH_MS = 2000;
  const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

  const LINK_TITLES = {
    up: "broker link up",
    closed: "broker link closed: the federation finished",
    down: "broker link down",
  };

  function $(id) { return document.getElementById(id); }

  function text(id, value) { $(id).textContent = value; }

  function bytes(n) {
    if (n === null || n === undefined) { return "–"; }
    const units = ["B", "KiB", "MiB", "GiB"];
    let v = n;
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
  }

  function ago(seconds) {
    if (seconds === null || seconds === undefined) { return "never"; }
    if (seconds < 60) { return seconds.toFixed(0) + " s ago"; }
    if (seconds < 3600) { return (seconds / 60).toFixed(0) + " min ago"; }
    return (seconds / 3600).toFixed(1) + " h ago";
  }

  function pct(value) {
    return value === null || value === undefined ? "–" : (100 * value).toFixed(1) + " %";
  }

  // A round tick step for about `count` steps over `range`: 1, 2 or 5 times a power of ten.
  function niceStep(range, count) {
    const raw = range / count;
    const magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / magnitude;
    return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * magnitude;
  }

  // Ticks at multiples of `step` within [lo, hi], with as many decimals as the step needs.
  function ticks(lo, hi, step) {
    const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
    const out = [];
    for (let i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i += 1) {
      out.push({ value: i * step, label: (i * step).toFixed(decimals) });
    }
    return out;
  }

  const NO_L1 = "Not known here: the devices' label distributions never leave the devices. A harness that made the data (ursa demo) shows it.";
  const L1_SOON = "Comes with each round: the harness (ursa demo) knows the partition it made and adds it when a round completes.";

  // A line chart on a canvas: series = [{label, colour, width, points: [[x, y]], bars}]
  function chart(canvas, series, options) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || canvas.width;
    const height = canvas.clientHeight || canvas.height;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    let points = 0;
    const xs = [];
    const ys = [];
    series.forEach(function (s) {
      s.points.forEach(function (p) {
        if (p[1] !== null && isFinite(p[1])) { xs.push(p[0]); ys.push(p[1]); points += 1; }
      });
    });
    canvas.dataset.points = String(points);
    if (points === 0) { return 0; }
    const pad = { left: 48, right: 12, top: 10, bottom: 28 };
    let xMin = Math.min.apply(null, xs);
    let xMax = Math.max.apply(null, xs);
    if (series.some(function (s) { return s.bars; })) { xMin -= 0.5; xMax += 0.5; }
    if (xMin === xMax) { xMin -= 1; xMax += 1; }
    let yMin = options.yMin !== undefined ? options.yMin : Math.min.apply(null, ys);
    let yMax = options.yMax !== undefined ? options.yMax : Math.max.apply(null, ys);
    if (options.yMin === undefined) { yMin = Math.min(0, yMin); }
    if (yMin === yMax) { yMax = yMin + 1; }
    const yStep = niceStep(yMax - yMin, 5);
    if (options.yMin === undefined) { yMin = Math.floor(yMin / yStep) * yStep; }
    if (options.yMax === undefined) { yMax = Math.ceil(yMax / yStep - 1e-9) * yStep; }
    const yTicks = ticks(yMin, yMax, yStep);
    const xTicks = ticks(xMin, xMax, Math.max(1, Math.round(niceStep(xMax - xMin, 10))));
    canvas.dataset.yticks = yTicks.map(function (t) { return t.label; }).join(",");
    canvas.dataset.xticks = xTicks.map(function (t) { return t.label; }).join(",");
    const plotW = width - pad.left - pad.right;
    const plotH = height - pad.top - pad.bottom;
    function px(x) { return pad.left + (x - xMin) / (xMax - xMin) * plotW; }
    function py(y) { return pad.top + (1 - (y - yMin) / (yMax - yMin)) * plotH; }
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#dde1e8";
    ctx.fillStyle = "#6b7385";
    ctx.lineWidth = 1;
    yTicks.forEach(function (t) {
      ctx.beginPath();
      ctx.moveTo(pad.left, py(t.value));
      ctx.lineTo(width - pad.right, py(t.value));
      ctx.stroke();
      ctx.textAlign = "right";
      ctx.fillText(t.label, pad.left - 6, py(t.value) + 4);
    });
    ctx.textAlign = "center";
    xTicks.forEach(function (t) {
      ctx.fillText(t.label, px(t.value), height - pad.bottom + 16);
    });
    ctx.fillText(options.xLabel || "round", pad.left + plotW / 2, height - 2);
    const barSeries = series.filter(function (s) { return s.bars; });
    const barW = Math.max(2, Math.min(24, plotW / Math.max(1, xMax - xMin + 1) / (barSeries.length + 1)));
    barSeries.forEach(function (s, index) {
      ctx.fillStyle = s.colour;
      s.points.forEach(function (p) {
        if (p[1] === null || !isFinite(p[1])) { return; }
        const x = px(p[0]) + (index - barSeries.length / 2) * barW;
        ctx.fillRect(x, py(p[1]), barW - 1, py(yMin) - py(p[1]));
      });
    });
    series.filter(function (s) { return !s.bars; }).forEach(function (s) {
      ctx.strokeStyle = s.colour;
      ctx.fillStyle = s.colour;
      ctx.lineWidth = s.width || 1.5;
      ctx.beginPath();
      let drawing = false;
      s.points.forEach(function (p) {
        if (p[1] === null || !isFinite(p[1])) { drawing = false; return; }
        if (drawing) { ctx.lineTo(px(p[0]), py(p[1])); } else { ctx.moveTo(px(p[0]), py(p[1])); }
        drawing = true;
      });
      ctx.stroke();
      s.points.forEach(function (p) {
        if (p[1] === null || !isFinite(p[1])) { return; }
        ctx.beginPath();
        ctx.arc(px(p[0]), py(p[1]), (s.width || 1.5) + 0.5, 0, 2 * Math.PI);
        ctx.fill();
      });
    });
    return points;
  }

  function legend(id, series) {
    const box = $(id);
    box.textContent = "";
    series.forEach(function (s) {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = s.colour;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(s.label));
      box.appendChild(item);
    });
  }

  function show(id, visible) { $(id).classList.toggle("hidden", !visible); }

  function accuracySeries(rounds) {
    const server = rounds.some(function (r) { return r.accuracy !== null; });
    const overall = server ? "accuracy" : "federated_accuracy";
    const perClass = server ? "per_class_accuracy" : "federated_per_class";
    const classes = rounds.reduce(function (n, r) { return Math.max(n, r[perClass].length); }, 0);
    const series = [];
    for (let c = 0; c < classes; c += 1) {
      series.push({
        label: "class " + c,
        colour: COLOURS[c % COLOURS.length],
        width: 1,
        points: rounds.filter(function (r) { return r[perClass].length > c; })
          .map(function (r) { return [r.round, r[perClass][c]]; }),
      });
    }
    series.push({
      label: "overall",
      colour: "#1d2330",
      width: 3,
      points: rounds.filter(function (r) { return r[overall] !== null; })
        .map(function (r) { return [r.round, r[overall]]; }),
    });
    return { series: series, server: server };
  }

  function renderCharts(rounds, harnessFigures) {
    const acc = accuracySeries(rounds);
    const accPoints = chart($("chart-accuracy"), acc.series, { yMin: 0, yMax: 1 });
    legend("legend-accuracy", accPoints ? acc.series : []);
    show("empty-accuracy", accPoints === 0);
    text("accuracy-source", accPoints === 0 ? "" :
      (acc.server ? "(coordinator's test data)" : "(federated: the devices' own data)"));
    const l1 = rounds.filter(function (r) { return r.l1_to_uniform !== undefined && r.l1_to_uniform !== null; })
      .map(function (r) { return [r.round, r.l1_to_uniform]; });
    const l1Points = chart($("chart-l1"), [{ label: "‖p_o − p_u‖₁", colour: "#9467bd", width: 2, points: l1 }], {});
    show("empty-l1", l1Points === 0);
    text("empty-l1", harnessFigures.indexOf("l1_to_uniform") >= 0 ? L1_SOON : NO_L1);
    const trafficSeries = [
      { label: "KiB in", colour: "#2ca02c", bars: true,
        points: rounds.map(function (r) { return [r.round, r.bytes_received === null ? null : r.bytes_received / 1024]; }) },
      { label: "KiB out", colour: "#ff7f0e", bars: true,
        points: rounds.map(function (r) { return [r.round, r.bytes_sent === null ? null : r.bytes_sent / 1024]; }) },
    ];
    const trafficPoints = chart($("chart-traffic"), trafficSeries, {});
    legend("legend-traffic", trafficPoints ? trafficSeries : []);
    show("empty-traffic", trafficPoints === 0);
    const timeSeries = [{ label: "wall time (s)", colour: "#1f77b4", width: 2,
      points: rounds.map(function (r) { return [r.round, r.elapsed_s]; }) }];
    const timePoints = chart($("chart-time"), timeSeries, {});
    show("empty-time", timePoints === 0);
    return accPoints + l1Points + trafficPoints + timePoints;
  }

  function renderDevices(devices) {
    const body = $("devices-table").tBodies[0];
    body.textContent = "";
    devices.list.forEach(function (d) {
      const row = body.insertRow();
      row.insertCell().textContent = d.id;
      const state = row.insertCell();
      const sits = typeof d.sitting_out === "string";
      const failing = typeof d.failing === "number";
      state.textContent = (d.online ? "online" : "offline") +
        (sits ? ", sitting out" : failing ? ", failing" : "");
      state.className = sits || failing ? "trouble" : d.online ? "online" : "offline";
      state.dataset.health = sits ? "sitting-out" : failing ? "failing" : "ok";
      if (sits) {
        state.title = "sits the key epoch out: " + (d.sitting_out || "no reason given");
      } else if (failing) {
        state.title = "failed " + d.failing + " selected rounds in a row";
      }
      row.insertCell().textContent = ago(d.last_seen_ago_s);
      ["selected", "trained", "failed"].forEach(function (name) {
        const cell = row.insertCell();
        cell.textContent = String(d[name] || 0);
        if (name === "failed" && d[name] > 0) { cell.className = "offline"; }
      });
    });
  }

  function renderErrors(errors, rejected) {
    const list = $("errors");
    list.textContent = "";
    if (errors.length === 0) {
      const li = document.createElement("li");
      li.className = "muted";
      li.textContent = "none";
      list.appendChild(li);
    }
    errors.slice().reverse().forEach(function (e) {
      const li = document.createElement("li");
      li.className = e.level;
      li.textContent = new Date(e.at * 1000).toLocaleTimeString() + " " + e.level + " " + e.message;
      list.appendChild(li);
    });
    const body = $("rejected-table").tBodies[0];
    body.textContent = "";
    if (Object.keys(rejected).length === 0) {
      const cell = body.insertRow().insertCell();
      cell.colSpan = 2;
      cell.className = "muted";
      cell.textContent = "none";
    }
    Object.keys(rejected).sort().forEach(function (reason) {
      const row = body.insertRow();
      row.insertCell().textContent = reason;
      row.insertCell().textContent = String(rejected[reason]);
    });
  }

  function render(s) {
    text("federation", s.federation);
    text("stage", s.stage);
    $("link").className = "dot " + s.link;
    $("link").title = LINK_TITLES[s.link] || "broker link";
    text("updated", "updated " + new Date(s.collected_at * 1000).toLocaleTimeString());
    text("round", s.round + " / " + s.rounds_total);
    text("round-sub", (s.stage === "done" ? "finished: " : "") + s.rounds_completed +
      " completed, " + s.updates + " updates");
    text("devices", s.devices.online + " / " + s.devices.enrolled);
    text("devices-sub", "online / enrolled");
    text("trouble", (s.devices.failing || 0) + " / " + (s.devices.sitting_out || 0));
    $("trouble").className = "value" +
      ((s.devices.failing || 0) + (s.devices.sitting_out || 0) > 0 ? " trouble" : "");
    const server = s.accuracy.server;
    const federated = s.accuracy.federated;
    text("accuracy", pct(server !== undefined ? server : federated));
    text("accuracy-sub", (server !== undefined ? "server" : federated !== undefined ? "federated" : "not evaluated yet") +
      (server !== undefined && federated !== undefined ? ", federated " + pct(federated) : ""));
    text("bytes", bytes(s.traffic.bytes_received) + " in");
    text("bytes-sub", bytes(s.traffic.bytes_sent) + " out, " + s.traffic.messages_received + " / " +
      s.traffic.messages_sent + " messages in / out");
    text("crypto", s.crypto_s.toFixed(2) + " s");
    text("methods", s.methods.join(", ") || "–");
    text("epoch", "key epoch " + s.epoch +
      (typeof s.epsilon === "number" ? ", privacy spent \u03b5 " + s.epsilon.toFixed(2) : ""));
    const points = renderCharts(s.rounds, s.round_figures || []);
    renderDevices(s.devices);
    renderErrors(s.errors, s.rejected);
    document.body.dataset.state = "ready";
    document.body.dataset.rounds = String(s.rounds.length);
    document.body.dataset.points = String(points);
  }

  function refresh() {
    // same-origin: the session cookie the login set goes along by itself
    fetch("api/status", { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.status === 401) { window.location.assign("login"); }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(render)
      .catch(function (error) {
        document.body.dataset.state = "error";
        text("updated", "cannot read the status: " + error.message);
        $("link").className = "dot down";
      })
      .finally(function () { window.setTimeout(refresh, REFRESH_MS); });
  }

  refresh();
}());
