(function () {
  var data = JSON.parse(document.getElementById('timeline') ? document.getElementById('timeline').textContent
                                                            : 'null');
  var svg = document.getElementById('memory'), cursor = document.getElementById('cursor');
  var readout = document.getElementById('readout');
  function human(b) {
    var units = ['B', 'KB', 'MB', 'GB', 'TB'], k = 0;
    while (Math.abs(b) >= 1024 && k < units.length - 1) { b /= 1024; k++; }
    return k ? b.toFixed(1) + ' ' + units[k] : b.toFixed(0) + ' B';
  }
  if (data && svg) {
    svg.addEventListener('mousemove', function (e) {
      var box = svg.getBoundingClientRect(), scale = svg.viewBox.baseVal.width / box.width;
      var x = (e.clientX - box.left) * scale, n = data.points.length;
      var k = Math.round((x - data.left) / data.width * (n - 1));
      if (k < 0 || k >= n) { cursor.style.visibility = 'hidden'; return; }
      var cx = data.left + data.width * k / Math.max(n - 1, 1);
      cursor.setAttribute('x1', cx); cursor.setAttribute('x2', cx); cursor.style.visibility = 'visible';
      readout.textContent = 'after ' + data.points[k][0] + ': ' + human(data.points[k][1]) + ' live';
    });
  }
  var modules = Array.prototype.slice.call(document.querySelectorAll('details'));
  document.getElementById('expand').onclick = function () { modules.forEach(function (d) { d.open = true; }); };
  document.getElementById('collapse').onclick = function () { modules.forEach(function (d) { d.open = false; }); };
  var rows = Array.prototype.slice.call(document.querySelectorAll('tr.row'));
  document.getElementById('filter').addEventListener('input', function () {
    var q = this.value.trim().toLowerCase();
    rows.forEach(function (tr) {
      var hit = !q || tr.textContent.toLowerCase().indexOf(q) >= 0 || tr.dataset.name.toLowerCase().indexOf(q) >= 0;
      tr.classList.toggle('hidden', !hit);
      for (var d = tr.parentElement; q && hit && d; d = d.parentElement) { if (d.tagName === 'DETAILS') d.open = true; }
    });
  });
  document.documentElement.setAttribute('data-ready', '1');
})();
