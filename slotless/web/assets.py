"""The page's stylesheet, served inline in every page (no build step, no second request;
the live script is static/live.js)."""

# Waiting that is healthy (DEFERRED, SENSING) is drawn in cool colours with a dashed
# outline; trouble (RETRYING, FAILED, UPSTREAM_FAILED) in warm colours with a heavy
# solid one. The state's name is always written too, so colour is never the only cue
# (a run's square on the DAGs page carries its state's mark and says it in its title).
CSS = """
:root { --fg: #1d2330; --muted: #5f6b7a; --line: #d7dce3; --bg: #f7f8fa; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: var(--fg); background: var(--bg); }
header { display: flex; gap: 1.2em; align-items: baseline; padding: .6em 1.2em;
         background: #1d2330; color: #fff; }
header a { color: #fff; text-decoration: none; font-weight: 600; }
header .db { color: #aab4c3; font-size: 12px; font-family: ui-monospace, monospace; }
header .live { margin-left: auto; font-size: 12px; color: #aab4c3; }
header .live.on::before { content: "\\25CF "; color: #4caf50; }
main { padding: 1em 1.2em 3em; }
h1 { font-size: 20px; margin: .2em 0 .5em; }
h2 { font-size: 16px; margin: 1.4em 0 .5em; }
a { color: #1f5fbf; }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); }
th, td { padding: .3em .7em; border-bottom: 1px solid var(--line); text-align: left;
         vertical-align: top; }
th { background: #eef1f5; font-weight: 600; font-size: 12px; color: var(--muted); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
.muted { color: var(--muted); }
.crumbs { color: var(--muted); margin-bottom: .3em; }
.meta { display: flex; flex-wrap: wrap; gap: .4em 1.6em; margin: .3em 0 1em; }
.meta b { color: var(--muted); font-weight: 500; margin-right: .3em; }
.badge { display: inline-block; padding: 0 .5em; border-radius: 3px; font-size: 12px;
         font-weight: 600; border: 1px solid; white-space: nowrap; }
.st-PENDING { background: #eceff1; border-color: #90a4ae; color: #37474f; }
.st-RUNNING { background: #bbdefb; border-color: #1565c0; color: #0d3c78; }
.st-SUCCESS { background: #c8e6c9; border-color: #2e7d32; color: #1b4d1e; }
.st-DEFERRED { background: #e1bee7; border-color: #6a1b9a; color: #4a126b;
               border-style: dashed; }
.st-SENSING { background: #b2ebf2; border-color: #00838f; color: #004d55;
              border-style: dashed; }
.st-RETRYING { background: #ffe0b2; border-color: #e65100; color: #8a3000; border-width: 2px; }
.st-FAILED { background: #ffcdd2; border-color: #b71c1c; color: #7f1010; border-width: 2px; }
.st-UPSTREAM_FAILED { background: #ffccbc; border-color: #bf360c; color: #7a2408; }
.st-SKIPPED { background: #f5f5f5; border-color: #bdbdbd; color: #757575;
              border-style: dotted; }
.st-CANCELLED { background: #e0e0e0; border-color: #424242; color: #212121; }
.st-PAUSED { background: #fff59d; border-color: #f57f17; color: #5d4000; border-width: 2px; }
.attention { background: #fff8e1; border: 2px solid #f57f17; padding: .4em .8em;
             margin: .4em 0; font-weight: bold; }
.legend { display: flex; flex-wrap: wrap; gap: .4em; margin: .4em 0 .8em; }
.bar { display: flex; height: 10px; width: 220px; border-radius: 2px; overflow: hidden;
       background: #eceff1; border: 1px solid var(--line); }
.bar span { display: block; height: 100%; border: 0; border-radius: 0; }
.graph { background: #fff; border: 1px solid var(--line); overflow: auto; max-height: 75vh; }
.graph svg text { font: 12px system-ui, sans-serif; }
.graph svg .tid { font-weight: 600; }
.graph svg .sub { font-size: 11px; }
.graph svg path.edge { fill: none; stroke: #9aa5b4; stroke-width: 1.3; }
.graph svg a:hover rect.box { filter: brightness(.95); }
svg rect.box.st-PENDING { fill: #eceff1; stroke: #90a4ae; }
svg rect.box.st-RUNNING { fill: #bbdefb; stroke: #1565c0; stroke-width: 2; }
svg rect.box.st-SUCCESS { fill: #c8e6c9; stroke: #2e7d32; }
svg rect.box.st-DEFERRED { fill: #e1bee7; stroke: #6a1b9a; stroke-width: 2;
                           stroke-dasharray: 6 3; }
svg rect.box.st-SENSING { fill: #b2ebf2; stroke: #00838f; stroke-width: 2;
                          stroke-dasharray: 2 3; }
svg rect.box.st-RETRYING { fill: #ffe0b2; stroke: #e65100; stroke-width: 3; }
svg rect.box.st-FAILED { fill: #ffcdd2; stroke: #b71c1c; stroke-width: 3; }
svg rect.box.st-UPSTREAM_FAILED { fill: #ffccbc; stroke: #bf360c; stroke-width: 2; }
svg rect.box.st-SKIPPED { fill: #f5f5f5; stroke: #bdbdbd; stroke-dasharray: 1 3; }
svg rect.seg.st-PENDING { fill: #90a4ae; } svg rect.seg.st-RUNNING { fill: #1565c0; }
svg rect.seg.st-SUCCESS { fill: #2e7d32; } svg rect.seg.st-DEFERRED { fill: #6a1b9a; }
svg rect.seg.st-SENSING { fill: #00838f; } svg rect.seg.st-RETRYING { fill: #e65100; }
svg rect.seg.st-FAILED { fill: #b71c1c; } svg rect.seg.st-UPSTREAM_FAILED { fill: #bf360c; }
svg rect.seg.st-SKIPPED { fill: #bdbdbd; }
.panel { background: #fff; border: 1px solid var(--line); border-left-width: 5px;
         padding: .6em 1em; margin: .8em 0; max-width: 70em; }
.panel.st-DEFERRED, .panel.st-SENSING { border-style: solid; border-left-style: dashed; }
.panel h2 { margin-top: .1em; }
.panel dl { display: grid; grid-template-columns: max-content 1fr; gap: .2em 1em; margin: 0; }
.panel dt { color: var(--muted); }
.panel dd { margin: 0; }
.errors { border-left-color: #b71c1c; }
.errors ul { margin: 0; padding-left: 1.2em; }
.errors li { margin: .3em 0; }
.err { color: #7f1010; white-space: pre-wrap; word-break: break-word; }
table.dags td { vertical-align: middle; }
table.dags td:first-child { min-width: 18em; max-width: 36em; }
table.dags tr.broken td:first-child { border-left: 4px solid #b71c1c; }
.dag-id { font-weight: 600; }
.paused { color: var(--muted); font-weight: 600; }
.active { color: #2e7d32; font-weight: 600; }
.grid { display: flex; flex-wrap: wrap; gap: 3px; max-width: 472px; }  /* 25 a line */
.sq { display: inline-block; width: 16px; height: 16px; border-radius: 3px; font-size: 11px;
      line-height: 14px; text-align: center; color: #fff; text-decoration: none;
      border: 1px solid #757575; background: #9e9e9e; }
a.sq:hover { outline: 2px solid #1d2330; outline-offset: 1px; }
.legend .sq { vertical-align: middle; }
.sq.st-QUEUED { background: #cfd8dc; border: 1px dashed #546e7a; color: #37474f; }
.sq.st-RUNNING { background: #1e88e5; border: 1px solid #0d47a1; }
.sq.st-SUCCESS { background: #43a047; border: 1px solid #1b5e20; }
.sq.st-FAILED { background: #e53935; border: 1px solid #7f0000; }
.sq.st-CANCELLED { background: #9e9e9e; border: 1px solid #424242; }
.sq.st-PAUSED { background: #fbc02d; border: 2px solid #e65100; }
.log td.msg { white-space: pre-wrap; word-break: break-word; max-width: 80em; }
.log tr.k-error td { background: #fff3f3; }
.log tr.k-check td.msg { color: #4a126b; }
.log tr.k-log td.msg { color: #1d2330; }
pre.tb { margin: 0; white-space: pre-wrap; font-size: 12px; color: #7f1010; }
.warn { color: #b71c1c; font-weight: 600; }
.empty { color: var(--muted); font-style: italic; }
.banner { background: #fff8e1; border-bottom: 1px solid #ffe082; padding: .35em 1.2em;
          font-size: 12.5px; color: #6d4c00; }
.flash { padding: .5em .8em; margin: 0 0 .8em; border: 1px solid; border-radius: 3px;
         max-width: 70em; white-space: pre-wrap; word-break: break-word; }
/* the "Needs you" list (people.py) */
header .needs b { background: #555; color: #fff; border-radius: 8px; padding: 0 .45em; }
header .needs.on b { background: #e65100; }
.request { border: 1px solid #ccc; border-radius: 4px; padding: .6em .9em; margin: 0 0 1em; }
.request .subject { margin: 0 0 .3em; font-size: 1.1em; }
.request .facts { display: grid; grid-template-columns: max-content 1fr; gap: .1em .8em;
  margin: 0 0 .5em; font-size: 12px; }
.request .facts dt { color: #666; }
.request .facts dd { margin: 0; }
.request form.act { display: inline-block; margin: .3em .6em .3em 0; }
.request label.field { display: block; margin: .3em 0; }
.field-error { color: #b71c1c; font-weight: 600; margin-left: .5em; }
.flash.ok { background: #e8f5e9; border-color: #2e7d32; color: #1b4d1e; }
.flash.error { background: #ffebee; border-color: #b71c1c; color: #7f1010; font-weight: 600; }
form.act { display: inline-block; margin: 0 0 0 .6em; }
form.act button { font-size: 12px; padding: 0 .6em; cursor: pointer; }
header form.act { margin-left: .6em; }
header .account { color: #fff; font-size: 12px; }
details.trigger summary { cursor: pointer; color: #1f5fbf; }
details.trigger form.act { display: block; margin: .3em 0 0; }
details.trigger textarea { display: block; margin-bottom: .3em; }
form.login input { font: inherit; padding: .2em .4em; }
"""
