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

  // One socket per page. Each event is re-dispatched on <body> as "live:<event>" (DOM
  // CustomEvent with the data as detail), so pages and htmx (hx-trigger="live:x from:body")
  // can react without a reload. Reconnects with backoff; "live:reconnected" lets pages refetch.
  var path = document.body.getAttribute("data-live");
  if (!path) return;
  var dot = document.getElementById("live-dot");
  var delay = 500;
  var opened = false;
  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + path);
    socket.onopen = function () {
      if (dot) dot.classList.add("on");
      if (opened) document.body.dispatchEvent(new CustomEvent("live:reconnected"));
      opened = true;
      delay = 500;
    };
    socket.onmessage = function (message) {
      var payload = JSON.parse(message.data);
      document.body.dispatchEvent(new CustomEvent("live:" + payload.event, { detail: payload.data }));
    };
    socket.onclose = function () {
      if (dot) dot.classList.remove("on");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 15000);
    };
  }
  connect();
})();
