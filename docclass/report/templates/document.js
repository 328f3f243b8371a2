(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("doc-data").textContent);
  // What every page shares (methods.js, written once per report): methods' help, signed ones.
  data.help = window.DOCCLASS_METHODS.help;
  data.signed = window.DOCCLASS_METHODS.signed;
  // Scores travel packed (html.py's packed()): two base-64 digits per word for an integer
  // q + 2048, q in [-2047, 2047], and one scale per method: value = q · scale.
  var DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  function unpack(text, scale) {
    var values = [];
    for (var i = 0; i < text.length; i += 2) {
      values.push((DIGITS.indexOf(text[i]) * 64 + DIGITS.indexOf(text[i + 1]) - 2048) * scale);
    }
    return values;
  }
  Object.keys(data.scores).forEach(function (key) {
    data.scores[key] = unpack(data.scores[key], data.scale[key]);
  });
  // Layer maps travel packed too, one [text, scale] per block and head, rows one after another.
  if (data.layer_maps) {
    var side = data.map_words.length;
    data.layer_maps = data.layer_maps.map(function (heads) {
      return heads.map(function (pack) {
        var flat = unpack(pack[0], pack[1]), rows = [];
        for (var r = 0; r < side; r += 1) { rows.push(flat.slice(r * side, (r + 1) * side)); }
        return rows;
      });
    });
  }
  // Pool attention travels as its heads only: it is their mean.
  var heads = Object.keys(data.scores).filter(function (key) { return key.indexOf("attention_head") === 0; });
  if (!data.scores.attention && heads.length) {
    data.scores.attention = data.scores[heads[0]].map(function (_, i) {
      var total = 0;
      heads.forEach(function (key) { total += data.scores[key][i]; });
      return total / heads.length;
    });
    data.scale.attention = Math.max.apply(null, heads.map(function (key) { return data.scale[key]; }));
  }
  // The predicted class's contributions are the "class contribution" method's own scores.
  if (data.predicted !== null && data.scores.contribution) {
    data.scores["contribution:" + data.predicted] = data.scores.contribution;
    data.scale["contribution:" + data.predicted] = data.scale.contribution;
  }
  var methodSelect = document.getElementById("method");
  if (!methodSelect) { return; }
  var headSelect = document.getElementById("head");
  var depthSelect = document.getElementById("depth");
  var text = document.getElementById("text");
  var help = document.getElementById("method-help");
  var words = [];
  // Only the words read are elements; the unread rest is one block of text after the cut.
  for (var i = 0; i < data.words_read; i += 1) { words.push(document.getElementById("w" + i)); }

  var classA = document.getElementById("class-a");
  var classB = document.getElementById("class-b");
  // The menus of classes are filled here from data.classes (their names are in the file once).
  function option(value, label, selected) {
    var item = document.createElement("option");
    item.value = value;
    item.textContent = label;
    item.selected = selected;
    return item;
  }
  var contrastOption = methodSelect.querySelector('option[value="contrast"]');
  data.classes.forEach(function (name) {
    methodSelect.insertBefore(option("contribution:" + name, "contribution to " + name, false), contrastOption);
    if (classA) {
      classA.appendChild(option(name, name, name === data.predicted));
      classB.appendChild(option(name, name, name === data.runner_up));
    }
  });
  // Never a class against itself by default.
  if (classA && classB.value === classA.value && classB.options.length > 1) {
    classB.selectedIndex = classA.selectedIndex === 0 ? 1 : 0;
  }
  var contrastSum = document.getElementById("contrast-sum");

  // logit(a) − logit(b) is linear in the words' contributions, so their difference is exact.
  // The words' totals come summed at full precision (data.word_totals): the page's own scores
  // are packed to a 2,047th of their largest.
  function contrastScores() {
    var a = data.scores["contribution:" + classA.value], b = data.scores["contribution:" + classB.value];
    var difference = [];
    for (var i = 0; i < a.length; i += 1) { difference.push(a[i] - b[i]); }
    var gap = data.logits[classA.value] - data.logits[classB.value];
    var bias = data.bias[classA.value] - data.bias[classB.value];
    var words = data.word_totals[classA.value] - data.word_totals[classB.value];
    contrastSum.textContent = "logit(" + classA.value + ") − logit(" + classB.value + ") = " +
      gap.toFixed(3) + " = words " + words.toFixed(3) + " + bias " + bias.toFixed(3) +
      ". Red words pushed toward " + classA.value + ", blue toward " + classB.value + ".";
    return difference;
  }

  function currentKey() {
    var key = methodSelect.value;
    if (key === "attention" && headSelect.value !== "mean") { key = "attention_head" + headSelect.value; }
    if (key === "rollout" && depthSelect && depthSelect.value !== "all") { key = "rollout_depth" + depthSelect.value; }
    return key;
  }
  // Decimals a value of the shown method supports: its packing step is 1/2,047 of the largest
  // (step 0: every value exact zero). Printing more would show rounding as if it were data.
  var step = 0;
  function formatStep(value) {
    if (!step) { return String(value); }
    var decimals = Math.ceil(-Math.log10(step));
    if (decimals > 8) {  // a method whose largest score is below 2e-5: significant digits
      return value === 0 ? "0" : value.toExponential(Math.max(0, Math.ceil(Math.log10(Math.abs(value) / step)) - 1));
    }
    return value.toFixed(Math.max(0, decimals));
  }
  function format(value) {
    return Math.abs(value) >= 0.001 || value === 0 ? value.toFixed(4) : value.toExponential(2);
  }
  function ranks(scores, read) {
    var order = [];
    for (var i = 0; i < read; i += 1) { order.push(i); }
    order.sort(function (a, b) { return scores[b] - scores[a]; });
    // Equal values share a rank (1 + how many are larger): their order would be arbitrary.
    var rank = new Array(read);
    order.forEach(function (word, position) {
      var previous = order[position - 1];
      rank[word] = position > 0 && scores[previous] === scores[word] ? rank[previous] : position + 1;
    });
    return rank;
  }

  function paintMinimap(scores) {
    var map = document.getElementById("minimap");
    if (!map) { return; }
    var bins = [], mass = [], top = 0;
    for (var start = 0; start < data.n_words; start += data.bin_words) {
      bins.push([start, Math.min(start + data.bin_words, data.n_words)]);
    }
    bins.forEach(function (range) {
      var total = 0;
      for (var i = range[0]; i < Math.min(range[1], data.words_read); i += 1) { total += Math.abs(scores[i]); }
      mass.push(total); top = Math.max(top, total);
    });
    map.textContent = "";
    bins.forEach(function (range, b) {
      var cell = document.createElement("div");
      cell.style.setProperty("--o", top > 0 ? (mass[b] / top).toFixed(3) : "0");
      cell.title = "words " + (range[0] + 1) + "–" + range[1] + ": " + format(mass[b]);
      // The bin holding the first unread word shows where the model stopped reading.
      if (data.words_read < data.n_words && range[0] <= data.words_read && data.words_read < range[1]) {
        cell.classList.add("cutbin");
      }
      if (range[0] >= data.words_read) { cell.title += " (not read)"; }
      cell.addEventListener("click", function () { jumpTo(range[0]); });
      map.appendChild(cell);
    });
  }

  function paintSentences(scores, signed) {
    var list = document.getElementById("sentences");
    if (!list) { return; }
    var sums = data.sentences.map(function (sentence, s) {
      var total = 0;
      for (var i = sentence[0]; i < Math.min(sentence[1], data.words_read); i += 1) { total += scores[i]; }
      return { index: s, total: total };
    });
    sums.sort(function (a, b) { return signed ? Math.abs(b.total) - Math.abs(a.total) : b.total - a.total; });
    list.textContent = "";
    sums.slice(0, data.top_sentences).forEach(function (entry) {
      var sentence = data.sentences[entry.index];
      var item = document.createElement("li");
      var score = document.createElement("span");
      score.className = "score";
      score.textContent = format(entry.total);
      item.appendChild(score);
      item.appendChild(document.createTextNode(sentenceText(sentence[0], sentence[1])));
      item.addEventListener("click", function () { jumpTo(sentence[0]); });
      list.appendChild(item);
    });
  }

  // A sentence as the page shows it (whitespace runs as one space), cut past 300 characters.
  function sentenceText(first, end) {
    var range = document.createRange();
    range.setStartBefore(words[first]);
    range.setEndAfter(words[end - 1]);
    var fragment = range.cloneContents();
    fragment.querySelectorAll(".cut").forEach(function (cut) { cut.remove(); });
    var sentence = fragment.textContent.replace(/\s+/g, " ").trim();
    return sentence.length > 300 ? sentence.slice(0, 299) + "…" : sentence;
  }

  function paintFaithfulness(key) {
    var badge = document.getElementById("faithfulness-badge");
    if (!badge) { return; }
    var entry = data.faithfulness.methods[key];
    badge.classList.remove("ok", "warn");
    if (!entry) { badge.textContent = "not measured for this view"; return; }
    badge.textContent = entry.value.toFixed(3) + " vs random " + data.faithfulness.random.toFixed(3) +
      (entry.beats ? " · better than random" : " · no better than random");
    badge.classList.add(entry.beats ? "ok" : "warn");
  }

  function jumpTo(index) {
    // Past the words read, the cut line is where to look.
    var word = index < words.length ? words[index] : document.getElementById("cut");
    if (!word) { return; }
    word.scrollIntoView({ block: "center" });
    word.classList.add("flash");
    setTimeout(function () { word.classList.remove("flash"); }, 1500);
  }

  function paint() {
    var key = currentKey();
    var contrast = key === "contrast";
    var scores = contrast ? contrastScores() : data.scores[key];
    step = contrast ? data.scale["contribution:" + classA.value] + data.scale["contribution:" + classB.value]
      : data.scale[key];
    var signed = contrast || data.signed.indexOf(methodSelect.value.split(":")[0]) >= 0;
    if (classA) { document.getElementById("contrast-controls").hidden = !contrast; }
    if (contrastSum) { contrastSum.hidden = !contrast; }
    var read = data.words_read, top = 0;
    for (var i = 0; i < read; i += 1) { top = Math.max(top, Math.abs(scores[i])); }
    var rank = ranks(scores, read);
    var label = methodSelect.options[methodSelect.selectedIndex].text;
    if (key.indexOf("attention_head") === 0) { label = "pool attention, head " + headSelect.value; }
    if (key.indexOf("rollout_depth") === 0) { label = "rollout through the top " + depthSelect.value + " block(s)"; }
    if (contrast) { label = classA.value + " rather than " + classB.value; }
    text.classList.toggle("signed", signed);
    words.forEach(function (word, i) {
      if (i >= read) { return; }
      var value = scores[i];
      word.style.setProperty("--s", top > 0 ? (Math.abs(value) / top).toFixed(3) : "0");
      word.classList.toggle("neg", signed && value < 0);
      word.title = label + " " + formatStep(value) + " · rank " + rank[i] + " of " + read;
    });
    headSelect.disabled = methodSelect.value !== "attention";
    if (depthSelect) { depthSelect.disabled = methodSelect.value !== "rollout"; }
    document.getElementById("legend-plain").hidden = signed;
    document.getElementById("legend-signed").hidden = !signed;
    help.textContent = contrast ? "each word's contribution to the first class minus its contribution to the second." :
      (data.help[methodSelect.value.split(":")[0]] || "");
    paintFaithfulness(key);
    paintMinimap(scores);
    paintSentences(scores, signed);
  }

  function drawLayerMaps() {
    var holder = document.getElementById("layer-maps");
    if (!holder || !data.layer_maps) { return; }
    var labels = data.map_words, n = labels.length;
    var cell = Math.max(6, Math.min(16, Math.floor(420 / n))), margin = 90;
    var readout = document.getElementById("map-readout");
    data.layer_maps.forEach(function (heads, layer) {
      heads.forEach(function (matrix, head) {
        var figure = document.createElement("figure");
        var caption = document.createElement("figcaption");
        caption.textContent = "block " + layer + " · head " + head;
        var canvas = document.createElement("canvas");
        canvas.width = margin + n * cell; canvas.height = margin + n * cell;
        var context = canvas.getContext("2d");
        var top = 0;
        matrix.forEach(function (row) { row.forEach(function (v) { top = Math.max(top, v); }); });
        matrix.forEach(function (row, i) {
          row.forEach(function (v, j) {
            context.fillStyle = "rgba(217, 120, 30, " + (top > 0 ? v / top : 0).toFixed(3) + ")";
            context.fillRect(margin + j * cell, margin + i * cell, cell, cell);
          });
        });
        // Word labels are drawn as canvas text, never parsed as HTML.
        context.fillStyle = "#1d2329";
        context.font = Math.min(11, cell) + "px system-ui, sans-serif";
        context.textAlign = "right"; context.textBaseline = "middle";
        labels.forEach(function (word, i) {
          var label = word.length > 14 ? word.slice(0, 13) + "…" : word;
          context.fillText(label, margin - 3, margin + (i + 0.5) * cell);
          context.save();
          context.translate(margin + (i + 0.5) * cell, margin - 3);
          context.rotate(-Math.PI / 2);
          context.textAlign = "left";
          context.fillText(label, 0, 0);
          context.restore();
        });
        canvas.addEventListener("mousemove", function (event) {
          var box = canvas.getBoundingClientRect();
          var j = Math.floor((event.clientX - box.left - margin) / cell);
          var i = Math.floor((event.clientY - box.top - margin) / cell);
          if (i >= 0 && j >= 0 && i < n && j < n) {
            readout.textContent = "block " + layer + " · head " + head + ": “" + labels[i] +
              "” → “" + labels[j] + "” " + format(matrix[i][j]);
          }
        });
        figure.appendChild(caption);
        figure.appendChild(canvas);
        holder.appendChild(figure);
      });
    });
  }

  methodSelect.addEventListener("change", paint);
  headSelect.addEventListener("change", paint);
  if (depthSelect) { depthSelect.addEventListener("change", paint); }
  if (classA) { classA.addEventListener("change", paint); classB.addEventListener("change", paint); }
  paint();
  drawLayerMaps();
})();
