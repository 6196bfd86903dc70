// jobqueue dashboard: keeps the overview live and asks before an action.
// No library, no inline script (the Content-Security-Policy forbids both).
"use strict";

document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-confirm]");
  if (form && !window.confirm(form.dataset.confirm)) event.preventDefault();
});

// The overview's live part is HTML rendered (and escaped) by the server:
// fetched every few seconds and swapped in as it is, while the tab is visible.
const live = document.getElementById("live");
if (live) {
  const every = Number(live.dataset.refreshMs) || 2000;
  let busy = false;
  const refresh = async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const answer = await fetch(live.dataset.liveUrl, {credentials: "same-origin",
                                                         headers: {Accept: "text/html"}});
      if (answer.redirected || !answer.ok) {
        live.dataset.stale = "true";  // logged out, or the database is away
      } else {
        live.innerHTML = await answer.text();
        live.dataset.stale = "false";
        live.dataset.updated = String(Date.now());
      }
    } catch (e) {
      live.dataset.stale = "true";
    } finally {
      busy = false;
    }
  };
  setInterval(refresh, every);
  document.addEventListener("visibilitychange", refresh);
}
