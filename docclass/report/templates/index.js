(function () {
  "use strict";
  var search = document.getElementById("search");
  var show = document.getElementById("show");
  var cls = document.getElementById("cls");
  var shown = document.getElementById("shown");
  // Each row's id, true and predicted class are read from its cells once: the file carries them
  // only once per row.
  var rows = Array.prototype.slice.call(document.querySelectorAll("#documents tbody tr")).map(function (row) {
    var cells = row.cells;
    return {
      element: row,
      flags: row.dataset.flags.split(" "),
      search: [cells[0].textContent, cells[1].textContent, cells[2].textContent].join(" ").toLowerCase(),
      label: cells[1].textContent,
      predicted: cells[2].textContent
    };
  });
  function apply() {
    var needle = search.value.trim().toLowerCase();
    var count = 0;
    rows.forEach(function (row) {
      var visible = (!needle || row.search.indexOf(needle) >= 0) &&
        (show.value === "all" || row.flags.indexOf(show.value) >= 0) &&
        (!cls.value || row.label === cls.value || row.predicted === cls.value);
      row.element.classList.toggle("hidden", !visible);
      if (visible) { count += 1; }
    });
    shown.textContent = count + " of " + rows.length + " shown";
  }
  [search, show, cls].forEach(function (control) { control.addEventListener("input", apply); });
  apply();

  // Sortable tables: a click on a heading sorts by that column, a second click reverses.
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var body = table.tBodies[0];
    table.querySelectorAll("thead th").forEach(function (heading, column) {
      heading.classList.add("sorts");
      heading.addEventListener("click", function () {
        var numeric = heading.dataset.type === "num";
        var descending = heading.dataset.order !== "descending";
        heading.dataset.order = descending ? "descending" : "ascending";
        var sorted = Array.prototype.slice.call(body.rows).sort(function (a, b) {
          var x = a.cells[column].textContent, y = b.cells[column].textContent;
          var order = numeric ? (parseFloat(x) || 0) - (parseFloat(y) || 0) : x.localeCompare(y);
          return descending ? -order : order;
        });
        sorted.forEach(function (row) { body.appendChild(row); });
      });
    });
  });

  // Many classes: one class's word list at a time, picked by name.
  var picker = document.getElementById("lexicon-search");
  if (picker) {
    var blocks = Array.prototype.slice.call(document.querySelectorAll("#lexicon-many .lexicon-class"));
    picker.addEventListener("input", function () {
      var name = picker.value;
      var match = blocks.filter(function (block) { return block.dataset.class === name; });
      if (!match.length) { return; }
      blocks.forEach(function (block) { block.hidden = block !== match[0]; });
    });
  }
})();

// A link to one kind of error (#cell-N, from the table of confused pairs) opens its entry.
(function () {
  "use strict";
  function openTarget() {
    var target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    if (target && target.tagName === "DETAILS") { target.open = true; }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
})();
