// Upload page: drag-and-drop of several files or pasted text, an XHR upload with a progress bar, then the
// parsing progress fragment (htmx polling) until the report is ready and the page moves to it.
// Without JavaScript the form still posts and the report page shows the same progress. A refused
// upload leaves the form as it was (files, pasted text) with the server's reason above the button.
(function () {
  "use strict";
  var form = document.getElementById("upload-form");
  if (!form) return;
  var input = document.getElementById("file-input");
  var zone = document.getElementById("dropzone");
  var list = document.getElementById("file-list");
  var bar = document.getElementById("upload-progress");
  var errorBox = document.getElementById("upload-error");
  var button = document.getElementById("upload-button");
  var paste = document.getElementById("paste-input");
  var maxBytes = parseInt(form.dataset.maxBytes || "0", 10);

  function human(bytes) {
    var units = ["B", "KB", "MB", "GB"];
    var i = 0;
    while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
    return bytes.toFixed(i ? 1 : 0) + " " + units[i];
  }

  function showFiles() {
    list.textContent = "";
    var total = 0;
    Array.prototype.forEach.call(input.files, function (file) {
      var item = document.createElement("li");
      item.textContent = file.name + " (" + human(file.size) + ")";  // textContent: names stay text
      list.appendChild(item);
      total += file.size;
    });
    zone.classList.toggle("has-files", input.files.length > 0);
    return total;
  }

  function addFiles(files) {
    var merged = new DataTransfer();
    Array.prototype.forEach.call(input.files, function (f) { merged.items.add(f); });
    Array.prototype.forEach.call(files, function (f) { merged.items.add(f); });
    input.files = merged.files;
    showFiles();
  }

  function fail(message) {
    errorBox.textContent = message;
    errorBox.hidden = false;
    bar.hidden = true;
    button.disabled = false;
  }

  ["dragenter", "dragover"].forEach(function (name) {
    zone.addEventListener(name, function (event) {
      event.preventDefault();
      zone.classList.add("dragging");
    });
  });
  ["dragleave", "drop"].forEach(function (name) {
    zone.addEventListener(name, function (event) {
      event.preventDefault();
      zone.classList.remove("dragging");
    });
  });
  zone.addEventListener("drop", function (event) {
    if (event.dataTransfer && event.dataTransfer.files.length) addFiles(event.dataTransfer.files);
  });
  input.addEventListener("change", showFiles);

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    errorBox.hidden = true;
    var total = showFiles();
    var pasted = paste ? paste.value : "";
    if (!input.files.length && !pasted.trim()) {
      return fail(pasted ? "The pasted text is empty: paste a log, or choose a log file." : "Choose a log file or paste a log.");
    }
    total += new Blob([pasted]).size;
    if (maxBytes && total > maxBytes) return fail("These files are " + human(total) + "; the limit is " + human(maxBytes) + ".");
    button.disabled = true;
    bar.hidden = false;
    var progress = bar.querySelector("progress");
    var pct = bar.querySelector(".pct");
    var xhr = new XMLHttpRequest();
    xhr.open("POST", form.action);
    xhr.setRequestHeader("X-Requested-With", "XMLHttpRequest");
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", function (e) {
      if (!e.lengthComputable) return;
      var value = Math.round((e.loaded / e.total) * 100);
      progress.value = value;
      pct.textContent = value + "%";
    });
    xhr.addEventListener("load", function () {
      var body = null;
      try { body = JSON.parse(xhr.responseText); } catch (e) { body = null; }
      if (xhr.status !== 201 || !body) {
        return fail((body && body.error) || "The upload failed (HTTP " + xhr.status + ").");
      }
      progress.value = 100;
      pct.textContent = "100%";
      bar.querySelector(".label").textContent = "uploaded";
      form.classList.add("submitted");
      // A duplicate is a report that exists already: its page says so (a message from the server).
      if (!window.htmx || body.duplicate) { window.location.href = body.url; return; }
      var status = document.createElement("div");
      status.id = "report-status";
      status.className = "status-panel";
      status.setAttribute("hx-get", body.status_url);
      status.setAttribute("hx-trigger", "load, every 1s");
      status.setAttribute("hx-swap", "outerHTML");
      status.textContent = "Waiting for a worker…";
      var holder = document.getElementById("parse-progress");
      holder.textContent = "";
      holder.appendChild(status);
      window.htmx.process(status);
    });
    xhr.addEventListener("error", function () { fail("The upload failed: the server could not be reached."); });
    xhr.send(new FormData(form));
  });
})();
