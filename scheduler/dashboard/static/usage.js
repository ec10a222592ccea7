// Cost and GPU-hours over time: two uPlot charts drawn from /api/usage, redrawn every 5 s.
(function () {
  "use strict";
  const palette = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#718096"];
  let charts = null;
  // A cumulative charge moves in steps, at each attempt's end.
  const step = uPlot.paths.stepped({ align: 1 });

  function width(el) { return Math.max(320, el.clientWidth || 900); }

  function build(u) {
    const costEl = document.getElementById("cost-chart");
    const hoursEl = document.getElementById("hours-chart");
    const types = Object.keys(u.cost_by_type);
    const money = function (self, ticks) { return ticks.map(function (v) { return "$" + v.toLocaleString(); }); };
    const cost = new uPlot({
      title: "cumulative cost (USD)" + (u.simulated ? ", simulated runs" : ""),
      width: width(costEl), height: 260,
      series: [{}, { label: "total", stroke: "#1a202c", width: 2, paths: step }].concat(
        types.map(function (t, k) {
          return { label: t, stroke: palette[k % palette.length], paths: step };
        })),
      axes: [{}, { values: money, size: 70 }],
    }, [u.t, u.cost_usd].concat(types.map(function (t) { return u.cost_by_type[t]; })), costEl);
    const hours = new uPlot({
      title: "cumulative GPU-hours" + (u.simulated ? ", simulated runs" : ""),
      width: width(hoursEl), height: 220,
      series: [{}, { label: "GPU-hours", stroke: "#2b6cb0", fill: "rgba(43,108,176,0.12)", width: 2, paths: step }],
      axes: [{}, { size: 60 }],
    }, [u.t, u.gpu_hours], hoursEl);
    return { cost: cost, hours: hours, types: types.join("|") };
  }

  async function draw() {
    const r = await fetch("/api/usage", { cache: "no-store" });
    if (!r.ok) return;
    const u = await r.json();
    const types = Object.keys(u.cost_by_type).join("|");
    if (charts && charts.types === types) {
      charts.cost.setData([u.t, u.cost_usd].concat(Object.keys(u.cost_by_type).map(function (t) { return u.cost_by_type[t]; })));
      charts.hours.setData([u.t, u.gpu_hours]);
    } else {
      if (charts) { charts.cost.destroy(); charts.hours.destroy(); }
      charts = build(u);
    }
    document.body.dataset.usagePoints = String(u.t.length);
  }
  draw();
  setInterval(draw, 5000);
})();
