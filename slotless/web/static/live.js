// Keep a live page up to date in place: every --refresh seconds, GET the page's live blocks
// (render.live_blocks: the same template's live_* blocks, rendered by the server, escaped
// there) and put each into its data-block element when it changed. A block holding the
// focused form field waits for the next poll, so typing is never lost; <details> open
// before stay open after (matched by their id). Stops when the page is no longer live.
(function () {
  var body = document.body;
  var every = Math.max(500, Number(body.dataset.refresh || 2) * 1000);
  var paused = false;
  var probe = document.createElement("template");
  function typing(el) {
    var a = document.activeElement;
    return a && el.contains(a) && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName);
  }
  function apply(data) {
    Object.keys(data.blocks || {}).forEach(function (name) {
      var el = document.querySelector('[data-block="' + name + '"]');
      if (!el || typing(el) || el.dataset.html === data.blocks[name]) { return; }
      // Unchanged since the page was drawn (the first poll): leave the DOM alone, so a
      // click, a selection or a hover on it is not lost to a needless swap. Both sides go
      // through the browser's own serializer, so equal markup compares equal.
      probe.innerHTML = data.blocks[name];
      if (probe.innerHTML === el.innerHTML) { el.dataset.html = data.blocks[name]; return; }
      var open = Array.prototype.map.call(el.querySelectorAll("details[open][id]"),
                                          function (d) { return d.id; });
      el.innerHTML = data.blocks[name];
      el.dataset.html = data.blocks[name];
      open.forEach(function (id) {
        var d = document.getElementById(id);
        if (d) { d.open = true; }
      });
    });
    body.dataset.live = data.live ? "1" : "0";
    document.dispatchEvent(new CustomEvent("slotless:live", { detail: data }));
  }
  function schedule() {
    var on = body.dataset.live === "1" && body.dataset.poll;
    if (on) { setTimeout(tick, every); }
    var badge = document.getElementById("live");
    if (badge) {
      badge.className = on ? "live on" : "live";
      badge.textContent = on ? "live, refreshing" : "not live";
    }
  }
  function tick() {
    if (paused) { schedule(); return; }
    fetch(body.dataset.poll, { headers: { "Accept": "application/json" }, cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (data) { apply(data); } })
      .catch(function () {})
      .then(schedule);
  }
  window.slotless = { apply: apply, pause: function (p) { paused = !!p; } };
  schedule();
})();
