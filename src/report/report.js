// Draws the report from the JSON in #taper-data with uPlot. When done,
// <body data-rendered="N"> tells how many charts were drawn, and each
// chart's element carries data-points (a headless browser test reads them).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("taper-data").textContent);
  const runs = data.runs;
  const palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  const markerColors = { oom: "#d62728", skip: "#ff7f0e", reload: "#2ca02c", "reload-failed": "#9467bd", checkpoint: "#888888", "checkpoint-failed": "#8c564b", diverged: "#000000", best: "#1f77b4", "early-stop": "#17becf" };
  const width = Math.max(600, Math.min(1100, document.body.clientWidth - 20));
  const charts = document.getElementById("charts");
  let drawn = 0;

  // [xs, ys] with one value per x (the last written: a resumed run may
  // repeat steps), sorted by x, without nulls.
  function clean(xs, ys, scale) {
    const m = new Map();
    xs.forEach((x, i) => {
      if (x != null && ys[i] != null) m.set(x, scale ? ys[i] / scale : ys[i]);
    });
    const keys = Array.from(m.keys()).sort((a, b) => a - b);
    return [keys, keys.map((k) => m.get(k))];
  }

  // The markers as a uPlot plugin: a dashed vertical line per event, and
  // its label, drawn over the plot.
  function markersPlugin(markers) {
    return {
      hooks: {
        draw: [
          (u) => {
            const ctx = u.ctx;
            const { left, top, width: w, height: h } = u.bbox;
            ctx.save();
            ctx.font = Math.round(11 * devicePixelRatio) + "px system-ui, sans-serif";
            ctx.textAlign = "left";
            ctx.textBaseline = "alphabetic";
            markers.forEach((m, i) => {
              const x = u.valToPos(m.step, "x", true);
              if (x < left - 1 || x > left + w + 1) return;
              ctx.strokeStyle = markerColors[m.kind] || "#444";
              ctx.fillStyle = ctx.strokeStyle;
              ctx.lineWidth = devicePixelRatio;
              ctx.setLineDash(m.kind === "checkpoint" ? [2, 4] : [6, 3]);
              ctx.beginPath();
              ctx.moveTo(x, top);
              ctx.lineTo(x, top + h);
              ctx.stroke();
              if (m.kind !== "checkpoint") {
                const y = top + (12 + (i % 4) * 14) * devicePixelRatio;
                ctx.fillText(m.label, x + 3 * devicePixelRatio, y);
              }
            });
            ctx.restore();
          },
        ],
      },
    };
  }

  // One chart: `lines` are {label, xs, ys, color, points} over steps.
  function chart(title, yLabel, lines, extra) {
    const usable = lines.filter((l) => l.xs.length > 0);
    const box = document.createElement("div");
    box.className = "chart";
    charts.appendChild(box);
    if (usable.length === 0) {
      box.innerHTML = '<div class="none">' + title + ": no records</div>";
      return;
    }
    const joined = uPlot.join(usable.map((l) => [l.xs, l.ys]));
    const series = [{ label: "step" }].concat(
      usable.map((l) => ({
        label: l.label,
        stroke: l.color,
        width: l.points ? 0 : 1.5,
        dash: l.dash,
        spanGaps: true,
        paths: l.points ? () => null : undefined,
        points: { show: !!l.points, size: 7, fill: l.color },
      }))
    );
    const opts = {
      title: title,
      width: width,
      height: 260,
      scales: { x: { time: false }, y: extra && extra.range ? { range: extra.range } : {} },
      series: series,
      axes: [
        { label: "step", values: (u, vals) => vals.map((v) => (Number.isInteger(v) ? v : "")) },
        { label: yLabel, size: 80, values: (u, vals) => vals.map(tick) },
      ],
      plugins: extra && extra.markers ? [markersPlugin(extra.markers)] : [],
    };
    new uPlot(opts, joined, box);
    box.dataset.points = String(usable.reduce((n, l) => n + l.xs.length, 0));
    box.dataset.title = title;
    drawn += 1;
  }

  // Axis values with enough digits to tell ticks apart (0.0025, 12k).
  function tick(v) {
    if (v == null) return "";
    const a = Math.abs(v);
    if (a >= 1e4) return (v / 1e3).toPrecision(3).replace(/\.0+$/, "") + "k";
    return String(+v.toPrecision(3));
  }

  const color = (i) => palette[i % palette.length];
  const many = runs.length > 1;
  const name = (r, what) => (many ? r.name + " " + what : what);
  // Per-step records when the run wrote them, else its epoch records.
  const perStep = (r, key, epochKey, scale) =>
    r.steps.step.length > 0 && r.steps[key].some((v) => v != null)
      ? clean(r.steps.step, r.steps[key], scale)
      : clean(r.epochs.step, r.epochs[epochKey || key], scale);

  const loss = [];
  runs.forEach((r, i) => {
    const [xs, ys] = perStep(r, "loss");
    loss.push({ label: name(r, "train loss"), xs, ys, color: color(i) });
    const [ex, ey] = clean(r.epochs.step, r.epochs.loss);
    if (r.steps.step.length > 0) loss.push({ label: name(r, "epoch mean"), xs: ex, ys: ey, color: color(i), points: true });
    const [vx, vy] = clean(r.evals.step, r.evals.loss);
    loss.push({ label: name(r, "eval loss"), xs: vx, ys: vy, color: color(i + 3), points: true });
  });
  chart("Loss", "loss", loss);

  const acc = runs.map((r, i) => {
    const [xs, ys] = clean(r.evals.step, r.evals.accuracy, 0.01);
    return { label: name(r, "eval accuracy %"), xs, ys, color: color(i), points: true };
  });
  // A percentage: up to 100, from the tens below the lowest point (uPlot's
  // own range padded it past 100).
  const percent = (u, min) => [Math.max(0, Math.floor((min - 2) / 10) * 10), 100];
  if (acc.some((l) => l.xs.length > 0)) chart("Evaluation accuracy", "%", acc, { range: percent });

  // A regression's root mean squared error, in its target's units; with
  // several targets (units apart), a chart per target.
  const several = (r) => (r.evals.per_target || []).length > 0;
  const rmse = runs.map((r, i) => {
    const [xs, ys] = several(r) ? [[], []] : clean(r.evals.step, r.evals.rmse || []);
    return { label: name(r, "eval RMSE"), xs, ys, color: color(i), points: true };
  });
  if (rmse.some((l) => l.xs.length > 0)) chart("Evaluation RMSE", "target's units", rmse);
  const targets = [];
  runs.forEach((r) => (r.evals.per_target || []).forEach((t) => {
    if (!targets.includes(t.target)) targets.push(t.target);
  }));
  targets.forEach((target) => {
    const lines = runs.map((r, i) => {
      const t = (r.evals.per_target || []).find((t) => t.target === target);
      const [xs, ys] = t ? clean(r.evals.step, t.rmse) : [[], []];
      return { label: name(r, "eval RMSE"), xs, ys, color: color(i), points: true };
    });
    chart("Evaluation RMSE: " + target, target + "'s units", lines);
  });

  chart("Learning rate", "lr", runs.map((r, i) => {
    const [xs, ys] = perStep(r, "lr");
    return { label: name(r, "lr"), xs, ys, color: color(i) };
  }));

  chart("Throughput", "per second", runs.map((r, i) => {
    const tokens = r.steps.tokens_per_s.some((v) => v != null);
    const [xs, ys] = perStep(r, tokens ? "tokens_per_s" : "samples_per_s", "samples_per_s");
    return { label: name(r, tokens ? "tokens/s" : "samples/s"), xs, ys, color: color(i) };
  }));

  const MiB = 1048576;
  const memory = [];
  const markers = [];
  runs.forEach((r, i) => {
    const device = r.steps.device_peak.some((v) => v != null) || r.epochs.device_peak.some((v) => v != null);
    const key = device ? "device_peak" : "memory_peak";
    const [xs, ys] = perStep(r, key, key, MiB);
    memory.push({ label: name(r, device ? "device peak MiB" : "heap peak MiB"), xs, ys, color: color(i) });
    if (!device && r.steps.memory.some((v) => v != null)) {
      const [cx, cy] = clean(r.steps.step, r.steps.memory, MiB);
      memory.push({ label: name(r, "heap MiB"), xs: cx, ys: cy, color: color(i), dash: [4, 3] });
    }
    if (r.limit != null && xs.length > 0) {
      memory.push({ label: name(r, "limit MiB"), xs: [xs[0], xs[xs.length - 1]], ys: [r.limit / MiB, r.limit / MiB], color: "#000", dash: [10, 5] });
    }
    r.markers.forEach((m) => markers.push(Object.assign({ run: r.name }, m)));
  });
  markers.sort((a, b) => a.step - b.step);
  chart("Memory", "MiB", memory, { markers: markers });

  // The events, as a table under the charts.
  const events = document.getElementById("events");
  if (markers.length === 0) {
    events.innerHTML = '<div class="none">no OOM, reload, skip or checkpoint</div>';
  } else {
    const t = document.createElement("table");
    t.id = "event-table";
    t.innerHTML = "<tr><th>step</th><th>event</th>" + (many ? "<th>run</th>" : "") + "</tr>";
    markers.forEach((m) => {
      const tr = document.createElement("tr");
      tr.dataset.kind = m.kind;
      const sw = '<span class="swatch" style="background:' + (markerColors[m.kind] || "#444") + '"></span>';
      tr.innerHTML = "<td>" + m.step + "</td><td>" + sw + "</td>" + (many ? "<td></td>" : "");
      tr.children[1].appendChild(document.createTextNode(m.label));
      if (many) tr.children[2].textContent = m.run;
      t.appendChild(tr);
    });
    events.appendChild(t);
  }

  // Config and outcome: one column per run.
  const table = document.createElement("table");
  table.id = "run-table";
  const keys = [];
  runs.forEach((r) => r.table.forEach(([k]) => { if (!keys.includes(k)) keys.push(k); }));
  const head = document.createElement("tr");
  head.appendChild(document.createElement("th"));
  runs.forEach((r, i) => {
    const th = document.createElement("th");
    th.innerHTML = '<span class="swatch" style="background:' + color(i) + '"></span>';
    th.appendChild(document.createTextNode(r.name));
    head.appendChild(th);
  });
  table.appendChild(head);
  keys.forEach((k) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = k;
    tr.appendChild(th);
    runs.forEach((r) => {
      const td = document.createElement("td");
      const row = r.table.find(([key]) => key === k);
      td.textContent = row ? row[1] : "";
      tr.appendChild(td);
    });
    table.appendChild(tr);
  });
  document.getElementById("runs").appendChild(table);
  document.body.dataset.rendered = String(drawn);
})();
