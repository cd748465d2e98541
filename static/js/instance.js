// The instance page: its own WebSocket (/ws/instances/<id>/) for its events and a log follow.
// Events are re-dispatched on <body> as "instance:<event>" so htmx can refresh the status
// (hx-trigger="instance:instance.state from:body"); log lines are appended to #log-text.
(function () {
  "use strict";
  var page = document.getElementById("instance-page");
  if (!page) return;
  var path = page.getAttribute("data-socket");
  if (!path) return;  // an ended rental: nothing live to watch
  var follow = document.getElementById("follow-logs");
  var status = document.getElementById("follow-status");
  var MAX_LINES = 5000;
  var socket = null;
  var delay = 500;
  var opened = false;
  var failedOpens = 0;
  var MAX_FAILED_OPENS = 10;  // handshakes in a row that never opened, then no more tries
  var greeted = false;  // the first "hello" came (later ones follow a reconnect)

  function logBox() {
    var box = document.getElementById("log-text");
    if (!box) {
      box = document.createElement("pre");
      box.className = "log";
      box.id = "log-text";
      document.getElementById("logs").replaceChildren(box);
    }
    return box;
  }

  function say(text) {
    if (status) status.textContent = text;
  }

  function startFollowing() {
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    var box = logBox();
    box.textContent = "";
    box.dataset.lines = "0";
    say("following…");
    socket.send(JSON.stringify({ type: "follow", tail: 200 }));
  }

  function stopFollowing() {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "unfollow" }));
    say("");
  }

  function append(lines) {
    var box = logBox();
    var atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 8;
    box.append(document.createTextNode(lines.join("\n") + "\n"));
    var count = parseInt(box.dataset.lines || "0", 10) + lines.length;
    if (count > MAX_LINES) {  // keep the page light: drop the oldest lines
      var text = box.textContent.split("\n");
      box.textContent = text.slice(text.length - MAX_LINES - 1).join("\n");
      count = MAX_LINES;
    }
    box.dataset.lines = String(count);
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  function shownState() {
    var badge = document.getElementById("state-badge");
    return badge ? badge.dataset.state : null;
  }

  // The instance changed state, so what the Logs panel says is out of date ("The container has
  // not started yet" under a Running badge): a follow starts again once the container runs;
  // otherwise the panel reads the log again.
  function logsChanged(state) {
    if (follow && follow.checked) {
      if (state === "running") startFollowing();  // a container that starts again
      return;
    }
    document.body.dispatchEvent(new CustomEvent("instance:logs-stale"));
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + path);
    var thisOpened = false;
    socket.onopen = function () {
      thisOpened = true;
      failedOpens = 0;
      if (opened) {  // events sent while we were away are lost: read the page again
        document.body.dispatchEvent(new CustomEvent("instance:reconnected"));
        logsChanged(null);
      }
      opened = true;
      delay = 500;
      if (follow && follow.checked) startFollowing();
    };
    socket.onmessage = function (message) {
      var payload = JSON.parse(message.data);
      if (payload.event === "logs") {
        append(payload.data.lines);
        if (payload.data.dropped) say("following (" + payload.data.dropped + " lines skipped: too fast to show)");
        return;
      }
      if (payload.event === "logs.end") {
        say(payload.data.reason);
        if (follow) follow.checked = false;
        return;
      }
      document.body.dispatchEvent(new CustomEvent("instance:" + payload.event, { detail: payload.data }));
      if (payload.event === "hello" && !greeted && payload.data.state !== shownState()) {
        // The state changed between this page's rendering and the socket's first
        // subscription: that event was sent before we listened, so read the page again now.
        document.body.dispatchEvent(new CustomEvent("instance:reconnected"));
        logsChanged(payload.data.state);
      }
      if (payload.event === "hello") greeted = true;
      if (payload.event === "instance.state") logsChanged(payload.data.state);
    };
    socket.onclose = function (event) {
      socket = null;
      if (event.code === 4404 || event.code === 4401 || event.code === 4403) return;  // not ours to watch
      // A handshake refused again and again (the browser shows it as 1006, like a network
      // failure) is given up on too, rather than retried for as long as the page is open.
      if (!thisOpened && ++failedOpens >= MAX_FAILED_OPENS) return;
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 15000);
    };
  }

  if (follow) {
    follow.addEventListener("change", function () {
      if (follow.checked) startFollowing(); else stopFollowing();
    });
  }
  // The tail view (the last 500 lines, fetched once) and the follow are two ways to read.
  var tail = document.getElementById("logs-tail");
  if (tail) {
    tail.addEventListener("click", function () {
      if (follow && follow.checked) { follow.checked = false; stopFollowing(); }
    });
  }
  connect();
})();
