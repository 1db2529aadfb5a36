// Draws the report's Plotly figures from their json_script data islands (never from inline JS),
// makes a click on a point open the log at that point's line, and wires the Copy buttons.
(function () {
  "use strict";

  function draw(el) {
    var island = document.getElementById(el.dataset.figure);
    if (!island || !window.Plotly) return;
    var fig = JSON.parse(island.textContent);
    window.Plotly.newPlot(el, fig.data, fig.layout, fig.config || {}).then(function () {
      el.dataset.drawn = "1";
    });
    var logUrl = el.dataset.logUrl;
    el.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      var data = point && point.customdata;
      // timeline points carry [hover, line]; throughput points the line alone
      var line = Array.isArray(data) ? data[1] : data;
      if (logUrl && line) {
        line = String(parseInt(line, 10));
        window.location.href = logUrl + "?line=" + line + "#L" + line;
      }
    });
  }

  // Plotly (1.2 MB of script to parse) is fetched once the page itself has loaded: the diagnosis, the
  // fix and the tables are readable at once, and the charts are drawn as soon as it is there.
  function drawAll() {
    document.querySelectorAll(".chart[data-figure]").forEach(draw);
  }
  function loadPlotly() {
    var source = document.getElementById("plotly-src");
    if (window.Plotly || !source) return drawAll();
    var script = document.createElement("script");
    script.src = source.dataset.src;
    script.onload = drawAll;
    document.head.appendChild(script);
  }
  if (document.querySelector(".chart[data-figure]")) {
    if (document.readyState === "complete") loadPlotly();
    else window.addEventListener("load", loadPlotly);
  }

  document.querySelectorAll("button.copy[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var source = document.getElementById(button.dataset.copy);
      if (!source) return;
      var done = function () {
        button.textContent = "Copied";
        setTimeout(function () { button.textContent = "Copy"; }, 1500);
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(source.textContent).then(done);
      } else {
        var range = document.createRange();
        range.selectNodeContents(source);
        var selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        document.execCommand("copy");
        done();
      }
    });
  });
})();
