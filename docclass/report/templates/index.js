(function () {
  "use strict";
  var search = document.getElementById("search");
  var show = document.getElementById("show");
  var cls = document.getElementById("cls");
  var shown = document.getElementById("shown");
  var rows = Array.prototype.slice.call(document.querySelectorAll("#documents tbody tr"));
  function apply() {
    var needle = search.value.trim().toLowerCase();
    var count = 0;
    rows.forEach(function (row) {
      var flags = row.dataset.flags.split(" ");
      var visible = (!needle || row.dataset.search.indexOf(needle) >= 0) &&
        (show.value === "all" || flags.indexOf(show.value) >= 0) &&
        (!cls.value || row.dataset.true === cls.value || row.dataset.pred === cls.value);
      row.classList.toggle("hidden", !visible);
      if (visible) { count += 1; }
    });
    shown.textContent = count + " of " + rows.length + " shown";
  }
  [search, show, cls].forEach(function (control) { control.addEventListener("input", apply); });
  apply();
})();
