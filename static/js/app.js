// Console glue: copy buttons and the live event feed over WebSocket.
(function () {
  "use strict";

  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) return;
    navigator.clipboard.writeText(source.textContent.trim()).then(function () {
      var label = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = label; }, 1200);
    });
  });

  // Phones: the header's Menu button folds the navigation open and shut.
  var navToggle = document.getElementById("nav-toggle");
  if (navToggle) {
    navToggle.addEventListener("click", function () {
      var open = document.body.classList.toggle("nav-open");
      navToggle.setAttribute("aria-expanded", open ? "true" : "false");
    });
  }

  // One socket per page. Each event is re-dispatched on <body> as "live:<event>" (DOM
  // CustomEvent with the data as detail), so pages and htmx (hx-trigger="live:x from:body")
  // can react without a reload. Reconnects with backoff; "live:reconnected" lets pages refetch.
  // A refusal is not retried: a close with 4401/4403/4404 (signed out, not in the team, not
  // the team's), or MAX_FAILED_OPENS handshakes in a row that never opened (a refused origin
  // or session looks like a network failure to the browser).
  var path = document.body.getAttribute("data-live");
  if (!path) return;
  var dot = document.getElementById("live-dot");
  var REFUSED = [4401, 4403, 4404];
  var MAX_FAILED_OPENS = 10;
  var delay = 500;
  var opened = false;
  var failedOpens = 0;
  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + path);
    var thisOpened = false;
    socket.onopen = function () {
      if (dot) dot.classList.add("on");
      if (opened) document.body.dispatchEvent(new CustomEvent("live:reconnected"));
      opened = true;
      thisOpened = true;
      failedOpens = 0;
      delay = 500;
    };
    socket.onmessage = function (message) {
      var payload = JSON.parse(message.data);
      document.body.dispatchEvent(new CustomEvent("live:" + payload.event, { detail: payload.data }));
    };
    socket.onclose = function (event) {
      if (dot) dot.classList.remove("on");
      if (REFUSED.indexOf(event.code) !== -1) return;
      if (!thisOpened && ++failedOpens >= MAX_FAILED_OPENS) return;
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 15000);
    };
  }
  connect();
})();
