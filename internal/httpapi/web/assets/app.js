// Compensa monitor: the retry, cancel, pause and resume buttons. Everything else on the
// page is rendered by the server. The buttons ask for a reason in a confirm
// dialog, call the JSON API with the page's session cookie (and the
// X-Compensa-Page header the API requires for that), and show the result.
"use strict";

(function () {
  const dialog = document.getElementById("confirm");
  const result = document.getElementById("result");
  let pending = null; // {action, id, label, button}

  function show(text, failed) {
    result.textContent = text;
    result.className = failed ? "failed" : "";
    result.hidden = false;
  }

  const explain = {
    retry: "Retry resumes the instance exactly where it stands: a FAILED instance re-runs the compensation that failed and then the ones below it; a stuck instance re-runs its current step now. No step is marked done or skipped.",
    cancel: "Cancel starts the compensation of this RUNNING instance: the steps that completed (or may have acted) are undone in reverse order.",
    pause: "Pause stops this instance where it stands: no step or compensation runs, through restarts, until it is resumed. A step in progress loses its lease and runs again after the resume.",
    resume: "Resume continues this PAUSED instance where it stood: a wait or reply timeout that passed meanwhile applies at once.",
    skip: "Skip gives up on this parked event: the sink never receives it. It is kept in relay_sink_skipped with your token's name, the time and this reason, and a replay with include_skipped can still deliver it.",
  };

  // Bulk: "Retry all N" / "Cancel all N" on a filtered list. A dry run
  // first tells how many match now; the confirm shows that number; the
  // real run goes in calls of at most 1000 until nothing is left.
  async function api(path, body) {
    const res = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Compensa-Page": "1" },
      body: JSON.stringify(body),
    });
    const data = await res.json().catch(function () { return {}; });
    return { ok: res.ok, status: res.status, data: data };
  }

  async function openBulk(btn) {
    const action = btn.dataset.bulk;
    const filter = JSON.parse(btn.dataset.filter || "{}");
    let dry;
    try {
      dry = await api("/v1/sagas/" + action, { filter: filter, reason: "dry run from the page", dry_run: true });
    } catch (e) {
      show("Request failed: " + e, true);
      return;
    }
    if (!dry.ok) {
      show("Dry run refused (" + dry.status + "): " + (dry.data.error || ""), true);
      return;
    }
    const n = dry.data.applicable;
    const skipped = dry.data.skipped || 0;
    pending = { bulk: action, filter: filter, count: n, button: btn };
    document.getElementById("confirm-title").textContent =
      (action === "retry" ? "Retry all " : "Cancel all ") + n + " instances?";
    document.getElementById("confirm-text").textContent =
      dry.data.matched + " instances match this filter now (" + JSON.stringify(filter) + "); " + n + " can be " +
      (action === "retry" ? "retried" : "cancelled") + " and " + skipped + " would be skipped (a " + action +
      " cannot act on them). Each is " + (action === "retry" ? "retried" : "cancelled") +
      " exactly as the single action would: " + explain[action];
    document.getElementById("confirm-reason").value = "";
    dialog.showModal();
  }

  async function sendBulk(p, reason) {
    p.button.disabled = true;
    const done = p.bulk === "retry" ? "retried" : "cancelled";
    const total = { acted: 0, already: 0, conflict: 0 };
    show((p.bulk === "retry" ? "Retrying " : "Cancelling ") + p.count + " instances…", false);
    for (let call = 0; call < 100; call++) {
      let r;
      try {
        r = await api("/v1/sagas/" + p.bulk, { filter: p.filter, reason: reason, dry_run: false, limit: 1000 });
      } catch (e) {
        show("Request failed: " + e, true);
        p.button.disabled = false;
        return;
      }
      if (!r.ok) {
        show("Refused (" + r.status + "): " + (r.data.error || ""), true);
        p.button.disabled = false;
        return;
      }
      const o = r.data.outcomes || {};
      const n = (o[done] || 0) + (o.already_requested || 0) + (o.conflict || 0);
      total.acted += o[done] || 0;
      total.already += o.already_requested || 0;
      total.conflict += o.conflict || 0;
      if (n === 0 || r.data.applicable <= n) break;
    }
    show(total.acted + " " + done + ", " + total.already + " already requested, " + total.conflict +
      " conflict (refused or changed meanwhile). Reload to see where they stand.", false);
  }

  document.addEventListener("click", function (ev) {
    const bulk = ev.target.closest("button[data-bulk]");
    if (bulk && !bulk.disabled) {
      openBulk(bulk);
      return;
    }
    const btn = ev.target.closest("button[data-action]");
    if (!btn || btn.disabled) return;
    pending = { action: btn.dataset.action, id: btn.dataset.id, sink: btn.dataset.sink, label: btn.dataset.label, button: btn };
    document.getElementById("confirm-title").textContent =
      ({ retry: "Retry ", cancel: "Cancel ", pause: "Pause ", resume: "Resume ", skip: "Skip " })[pending.action] + pending.label + "?";
    document.getElementById("confirm-text").textContent = explain[pending.action];
    document.getElementById("confirm-reason").value = "";
    dialog.showModal();
  });

  document.getElementById("confirm-no").addEventListener("click", function () {
    pending = null;
    dialog.close("cancel");
  });

  document.getElementById("confirm-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    const reason = document.getElementById("confirm-reason").value.trim();
    if (!reason) return;
    const p = pending;
    pending = null;
    dialog.close("ok");
    if (p && p.bulk) sendBulk(p, reason);
    else if (p && p.action === "skip") sendSkip(p, reason);
    else if (p) send(p, reason);
  });

  // sendSkip gives up on one event parked for a sink and strikes its row.
  async function sendSkip(p, reason) {
    p.button.disabled = true;
    show("Skipping " + p.label + "…", false);
    let r;
    try {
      r = await api("/v1/sinks/" + encodeURIComponent(p.sink) + "/parked/" + encodeURIComponent(p.id) + "/skip", { reason: reason });
    } catch (e) {
      show("Request failed: " + e, true);
      p.button.disabled = false;
      return;
    }
    if (!r.ok) {
      show("Skip refused (" + r.status + "): " + (r.data.error || ""), true);
      p.button.disabled = false;
      return;
    }
    show("Skipped " + p.label + ": the sink goes on with the next event.", false);
    const row = p.button.closest("tr");
    if (row) row.classList.add("skipped");
  }

  async function send(p, reason) {
    p.button.disabled = true;
    const verb = { retry: ["Retrying ", "Retry", "Retry requested: "], cancel: ["Cancelling ", "Cancel", "Cancel requested: "],
      pause: ["Pausing ", "Pause", "Paused: "], resume: ["Resuming ", "Resume", "Resumed: "] }[p.action];
    show(verb[0] + p.label + "…", false);
    let res, body;
    try {
      res = await fetch("/v1/sagas/" + encodeURIComponent(p.id) + "/" + p.action, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Compensa-Page": "1" },
        body: JSON.stringify({ reason: reason }),
      });
      body = await res.json().catch(function () { return {}; });
    } catch (e) {
      show("Request failed: " + e, true);
      p.button.disabled = false;
      return;
    }
    if (!res.ok) {
      show(verb[1] + " refused (" + res.status + "): " + (body.error || res.statusText), true);
      p.button.disabled = false;
      return;
    }
    const inst = body.instance || {};
    const step = inst.current_step + (inst.current_step_name ? " (" + inst.current_step_name + ")" : "");
    show((body.already_requested ? "Already requested, nothing changed: " : verb[2]) +
      "now " + inst.status + " at step " + step + ", attempt " + inst.attempt + "." +
      (inst.status === "PAUSED" ? " No runner takes it until it is resumed." : " A runner picks it up at once."), false);
    document.querySelectorAll('[data-id="' + p.id + '"] [data-field="status"], #instance[data-id="' + p.id + '"] #status').forEach(function (el) {
      el.textContent = inst.status;
      el.className = "status s-" + String(inst.status).toLowerCase();
    });
  }
})();
