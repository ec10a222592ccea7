// snugfit dashboard: re-fetch the page's live part (server-rendered HTML) every few seconds and
// soon after each placement-log event (server-sent events); on the log page, add each new
// event as a row. Read-only: nothing here writes.
(function () {
  "use strict";
  const body = document.body;
  const refreshMs = Number(body.dataset.refreshMs) || 2000;
  const fragment = body.dataset.fragment;
  const status = document.getElementById("live-status");
  const counts = document.getElementById("counts");
  let inflight = false;
  let again = false;

  function setStatus(text, ok) {
    if (!status) return;
    status.textContent = text;
    status.className = ok ? "ok" : "bad";
  }

  async function swap(url, el) {
    const r = await fetch(url, { cache: "no-store" });
    if (!r.ok) throw new Error(url + ": HTTP " + r.status);
    el.innerHTML = await r.text();
  }

  async function refresh() {
    if (inflight) { again = true; return; }
    inflight = true;
    try {
      const live = document.getElementById("live");
      if (fragment && live) await swap(fragment, live);
      if (counts) await swap("/fragment/counts", counts);
      setStatus("live · " + new Date().toLocaleTimeString(), true);
      document.dispatchEvent(new CustomEvent("snugfit:refreshed"));
    } catch (e) {
      setStatus("offline: " + e.message, false);
    } finally {
      inflight = false;
      if (again) { again = false; setTimeout(refresh, 200); }
    }
  }

  function addLogRow(e) {
    const table = document.getElementById("log");
    if (!table) return;
    const empty = document.getElementById("log-empty");
    if (empty) empty.remove();
    const tbody = table.tBodies[0];
    const tr = document.createElement("tr");
    tr.className = "event ev-" + String(e.event || "");
    tr.dataset.id = e.id;
    const when = typeof e.ts === "number"
      ? new Date(e.ts * 1000).toISOString().replace("T", " ").slice(0, 19) : "-";
    const cells = [when, String(e.event || "?")];
    for (const text of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    const job = document.createElement("td");
    if (e.job_id) {
      const a = document.createElement("a");
      a.href = "/job/" + encodeURIComponent(e.job_id);
      a.textContent = e.job_id;
      job.appendChild(a);
    }
    tr.appendChild(job);
    const line = document.createElement("td");
    line.className = "line";
    line.textContent = e.line || "";
    tr.appendChild(line);
    tbody.insertBefore(tr, tbody.firstChild);
    while (tbody.rows.length > 1000) tbody.deleteRow(tbody.rows.length - 1);
  }

  let soon = null;
  if (window.EventSource) {
    const after = body.dataset.after;
    const es = new EventSource("/api/events/stream" + (after ? "?after=" + encodeURIComponent(after) : ""));
    es.addEventListener("placement", function (msg) {
      const e = JSON.parse(msg.data);
      addLogRow(e);
      if (!soon) soon = setTimeout(function () { soon = null; refresh(); }, 300);
    });
    es.onopen = function () { setStatus("live", true); };
    es.onerror = function () { setStatus("event stream reconnecting", false); };
  }
  setInterval(refresh, refreshMs);
  refresh();
  window.snugfit = { refresh: refresh };
})();
