window.addEventListener('error', function (e) {
  var el = document.documentElement, seen = el.getAttribute('data-js-errors');
  el.setAttribute('data-js-errors', (seen ? seen + ' | ' : '') + e.message);
});
