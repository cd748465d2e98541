// The rent dialog: opens on a "Rent" button, shows the price live as the form changes.
(function () {
  "use strict";
  var dialog = document.getElementById("rent-dialog");
  if (!dialog) return;
  var form = document.getElementById("rent-form");
  var priceBox = document.getElementById("rent-price");
  var current = null;
  // Renting from a template: its disk is the default (as far as the offer has room).
  var DEFAULT_DISK_GB = +form.dataset.templateDisk || 10;

  // As the pages' filters write money (billing_money): an amount to the cent ("<$0.01" when
  // it is under a cent but not zero), a rate per hour exact to the micro-dollar.
  function money(micro) {
    var cents = Math.floor((micro + 5000) / 10000);
    if (cents === 0 && micro > 0) return "<$0.01";
    return "$" + (cents / 100).toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2});
  }

  function rate(micro) {
    var whole = Math.floor(micro / 1e6), digits = String(micro % 1e6).padStart(6, "0").replace(/0+$/, "");
    while (digits.length < 2) digits += "0";
    return "$" + whole.toLocaleString("en-US") + "." + digits;
  }

  function kind() {
    return form.querySelector("input[name=rent_kind]:checked").value;
  }

  function slicing() {
    return current && current.sharing && kind() === "slice";
  }

  function bidding() {
    return current && current.minBid !== null && kind() === "bid";
  }

  // The most disk the chosen size may have: the offer's disk per GPU (or per slice share).
  function maxDisk(units) {
    return Math.max(Math.floor(current.disk * units), 1);
  }

  // 10 GiB where the machine offers that much, else all it offers: the defaults must rent.
  function defaultDisk() {
    var units = slicing()
      ? Math.max((parseInt(form.core_percent.value, 10) || 0) / 100, (parseInt(form.memory_mb.value, 10) || 0) / current.cardMemory)
      : Math.max(current.min, 1);
    return Math.min(DEFAULT_DISK_GB, maxDisk(units));
  }

  // SSH mode: say before renting what would stop the renter logging in.
  var SSH_IMAGE = "gpumkt/sshbox:latest";
  function updateSshWarning() {
    var ssh = form.launch_mode.value === "ssh";
    var noSshd = ssh && /^gpumkt\/busybox(:|$)/.test(form.image.value.trim());
    var noKey = document.getElementById("ssh-no-key");
    document.getElementById("ssh-no-sshd").hidden = !noSshd;
    document.getElementById("ssh-warning").hidden = !(noSshd || (ssh && noKey));
  }

  function updatePrice() {
    if (!current) return;
    updateSshWarning();
    var slice = slicing();
    document.getElementById("slice-fields").hidden = !slice;
    document.getElementById("whole-gpus").hidden = slice;
    document.getElementById("bid-fields").hidden = !bidding();
    form.bid_price.disabled = !bidding();
    form.num_gpus.required = !slice;
    var gpus = slice ? 1 : parseInt(form.num_gpus.value, 10) || 0;
    var hours = parseFloat(form.duration_hours.value) || 0;
    var disk = parseInt(form.disk_gb.value, 10) || 0;
    var problems = [];
    var hourly = current.price * gpus, units = Math.max(gpus, 1);
    if (bidding()) {
      var bid = Math.round((parseFloat(form.bid_price.value) || 0) * 1e6);
      hourly = bid * gpus;
      if (bid < current.minBid) problems.push("Bid at least " + rate(current.minBid) + " per GPU-hour.");
    }
    if (slice) {
      // The server's rule: the card's rate × the larger of the compute and memory shares.
      var core = parseInt(form.core_percent.value, 10) || 0;
      var memory = parseInt(form.memory_mb.value, 10) || 0;
      units = Math.max(core / 100, memory / current.cardMemory);
      hourly = Math.round(current.price * units);
      if (core < current.minSlice || core > current.sliceCore) problems.push("Choose " + current.minSlice + "–" + current.sliceCore + " % of the card's compute.");
      if (memory < 1 || memory > current.sliceMemory) problems.push("At most " + current.sliceMemory + " MB of the card's memory is free on one card.");
    } else if (gpus < current.min || gpus > current.free) {
      problems.push("Choose " + current.min + "–" + current.free + " GPUs.");
    }
    // Same arithmetic as the server's quote: rate × hours + storage for the same time.
    var gpu = Math.round(hourly * hours);
    var storage = Math.round(current.storage * disk * hours / 720);
    if (disk > maxDisk(units)) problems.push("At most " + maxDisk(units) + " GiB of disk for " + (slice ? "this slice." : gpus + " GPU(s)."));
    if (current.end && hours * 3600e3 > new Date(current.end) - Date.now()) problems.push("The machine is offered until " + new Date(current.end).toLocaleString() + ".");
    priceBox.innerHTML = "<strong>" + money(gpu + storage) + "</strong> held now: " + money(gpu) + " GPU time (" +
      rate(hourly) + "/hour) + " + money(storage) + " storage. Unused credit is released at the end." +
      (problems.length ? '<div class="error">' + problems.join(" ") + "</div>" : "");
    document.getElementById("rent-confirm").disabled = problems.length > 0;
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest(".rent-button");
    if (!button) return;
    current = {
      machine: button.dataset.machine, free: +button.dataset.free, min: +button.dataset.min || 1,
      price: +button.dataset.price, storage: +button.dataset.storage, disk: +button.dataset.disk,
      end: button.dataset.end, sharing: button.dataset.sharing === "1",
      sliceCore: +button.dataset.sliceCore || 0, sliceMemory: +button.dataset.sliceMemory || 0,
      minSlice: +button.dataset.minSlice || 1, cardMemory: +button.dataset.cardMemoryMb || 1,
      minBid: button.dataset.minBid ? +button.dataset.minBid : null,
    };
    document.getElementById("rent-kind").hidden = !current.sharing && current.minBid === null;
    document.getElementById("rent-kind-slice").hidden = !current.sharing;
    document.getElementById("rent-kind-bid").hidden = current.minBid === null;
    document.getElementById("rent-min-bid").textContent = current.minBid === null ? "" : rate(current.minBid);
    form.bid_price.value = current.minBid === null ? "" : (current.minBid / 1e6).toString();
    form.querySelector("input[name=rent_kind][value=whole]").checked = current.free > 0 || !current.sharing;
    form.querySelector("input[name=rent_kind][value=slice]").checked = current.free === 0 && current.sharing;
    form.action = "/offers/" + current.machine + "/rent/";
    document.getElementById("rent-gpu").textContent = button.dataset.gpu;
    document.getElementById("rent-machine").textContent = current.machine;
    document.getElementById("rent-disk-note").hidden = button.dataset.diskEnforced === "1";
    if (form.volume) {  // only the team's volumes on this machine can be mounted
      Array.prototype.forEach.call(form.volume.options, function (option) {
        option.hidden = option.value !== "" && option.dataset.machine !== current.machine;
      });
      form.volume.value = "";
    }
    form.num_gpus.min = current.min;
    form.num_gpus.max = current.free;
    // The offer's bundle of GPUs, as priced on its card; then a disk that fits it.
    form.num_gpus.value = Math.max(+button.dataset.gpus || 0, current.min, 1);
    form.disk_gb.value = defaultDisk();
    updatePrice();
    dialog.showModal();
  });
  form.addEventListener("input", updatePrice);
  // Another kind has another size: its disk default follows, before the price is shown.
  form.addEventListener("change", function (event) {
    if (event.target.name !== "rent_kind") return;
    form.disk_gb.value = defaultDisk();
    updatePrice();
  });
  document.getElementById("use-ssh-image").addEventListener("click", function () {
    form.image.value = SSH_IMAGE;
    updatePrice();
  });
  document.getElementById("rent-cancel").addEventListener("click", function () { dialog.close(); });
})();
