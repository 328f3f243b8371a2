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

  // Many classes: one class's word list at a time, picked by name, built from the JSON block
  // (every piece of text goes in through textContent).
  var picker = document.getElementById("lexicon-search");
  if (picker) {
    var lexicon = JSON.parse(document.getElementById("lexicon-data").textContent);
    var holder = document.getElementById("lexicon-many");
    var element = function (tag, text, className) {
      var node = document.createElement(tag);
      if (text !== undefined) { node.textContent = text; }
      if (className) { node.className = className; }
      return node;
    };
    var pageOf = function (position) {
      return lexicon.dir + "/doc-" + String(position).padStart(5, "0") + ".html";
    };
    var showClass = function (name) {
      if (!Object.prototype.hasOwnProperty.call(lexicon.classes, name)) { return; }
      var entry = lexicon.classes[name];
      var block = element("div", undefined, "lexicon-class");
      block.dataset.class = name;
      var heading = element("h3", name, "name");
      heading.title = name;
      heading.appendChild(element("span", " (" + entry[0] + " document" + (entry[0] === 1 ? "" : "s") + ")", "muted small"));
      block.appendChild(heading);
      if (!entry[2].length) {
        block.appendChild(element("p", "No list: " + entry[1] + ".", "small muted no-list"));
      } else {
        var table = element("table", undefined, "small lexicon");
        var head = table.insertRow();
        [["word", ""], ["mean", "num"], ["total", "num"], ["docs", "num"]].forEach(function (column) {
          head.appendChild(element("th", column[0], column[1]));
        });
        entry[2].forEach(function (row) {
          var line = table.insertRow();
          var details = element("details"), list = element("ul", undefined, "plain");
          details.appendChild(element("summary", row[0]));
          row[4].forEach(function (doc) {
            var item = element("li"), link = element("a", lexicon.ids[doc[0]]);
            link.href = pageOf(doc[0]);
            item.appendChild(link);
            item.appendChild(document.createTextNode(" "));
            item.appendChild(element("span", doc[1].toPrecision(3), "muted"));
            list.appendChild(item);
          });
          details.appendChild(list);
          line.insertCell().appendChild(details);
          [row[1].toPrecision(3), row[2].toPrecision(3), String(row[3])].forEach(function (text) {
            var cell = line.insertCell();
            cell.className = "num";
            cell.textContent = text;
          });
        });
        block.appendChild(table);
      }
      holder.textContent = "";
      holder.appendChild(block);
    };
    picker.addEventListener("input", function () { showClass(picker.value); });
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
