// fastapi_jobs status page: ticks the countdowns, refreshes the page in place, and
// applies a state chosen in the filter.
// Served as a file (not inline) so that a CSP without 'unsafe-inline' allows it.
"use strict";
(() => {
  let offset = 0; // the server's clock minus this browser's

  const span = (s) => {
    s = Math.floor(s);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  };

  const main = () => document.getElementById("jobs");

  const sync = () => {
    const now = Date.parse(main()?.dataset.now ?? "");
    if (!Number.isNaN(now)) offset = now - Date.now();
  };

  const tick = () => {
    const now = Date.now() + offset;
    for (const el of document.querySelectorAll("time[data-countdown]")) {
      const left = (Date.parse(el.getAttribute("datetime")) - now) / 1000;
      el.textContent = left < 1 ? "due" : `in ${span(left)}`;
    }
  };

  const refresh = async () => {
    const current = main();
    // Not while hidden, nor while a button has the keyboard's focus.
    if (!current || document.hidden || current.contains(document.activeElement)) return;
    try {
      const answer = await fetch(address(), {
        headers: { Accept: "text/html" },
        cache: "no-store",
        credentials: "same-origin",
      });
      if (!answer.ok) return;
      const page = new DOMParser().parseFromString(await answer.text(), "text/html");
      const fresh = page.getElementById("jobs");
      if (fresh) {
        current.replaceWith(fresh);
        sync();
        tick();
      }
    } catch {
      // The app is restarting or the network is down: keep what is shown.
    }
  };

  // This page's address without a button's notice (a filter, ?q=, stays).
  const address = () => {
    const url = new URL(location.href);
    url.searchParams.delete("notice");
    url.searchParams.delete("job");
    return url.pathname + url.search;
  };

  // A state chosen in the filter's list applies at once (the button is for
  // the keyboard, and for a page without its script).
  document.addEventListener("change", (event) => {
    const chosen = event.target;
    if (chosen instanceof HTMLSelectElement && chosen.form?.classList.contains("filter")) {
      chosen.form.requestSubmit();
    }
  });

  const start = () => {
    // A notice from a button is shown once: the address loses it.
    if (location.search.includes("notice=")) history.replaceState(null, "", address());
    sync();
    tick();
    setInterval(tick, 1000);
    const every = Number(main()?.dataset.refresh) || 5;
    setInterval(refresh, every * 1000);
  };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
