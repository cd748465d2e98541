// The rent dialog: opens on a "Rent" button, shows the price live as the form changes.
(function () {
  "use strict";
  var dialog = document.getElementById("rent-dialog");
  if (!dialog) return;
  var form = document.getElementById("rent-form");
  var priceBox = document.getElementById("rent-price");
  var current = null;

  function money(micro) {
    return "$" + (micro / 1e6).toFixed(micro % 10000 === 0 ? 2 : 4);
  }

  function updatePrice() {
    if (!current) return;
    var gpus = parseInt(form.num_gpus.value, 10) || 0;
    var hours = parseFloat(form.duration_hours.value) || 0;
    var disk = parseInt(form.disk_gb.value, 10) || 0;
    // Same arithmetic as the server's quote: rate × GPUs × hours + storage for the same time.
    var gpu = Math.round(current.price * gpus * hours);
    var storage = Math.round(current.storage * disk * hours / 720);
    var problems = [];
    if (gpus < current.min || gpus > current.free) problems.push("Choose " + current.min + "–" + current.free + " GPUs.");
    if (disk > current.disk * Math.max(gpus, 1)) problems.push("At most " + current.disk * Math.max(gpus, 1) + " GB of disk for " + gpus + " GPU(s).");
    if (current.end && hours * 3600e3 > new Date(current.end) - Date.now()) problems.push("The machine is offered until " + new Date(current.end).toLocaleString() + ".");
    priceBox.innerHTML = "<strong>" + money(gpu + storage) + "</strong> held now: " + money(gpu) + " GPU time (" +
      money(current.price * gpus) + "/hour) + " + money(storage) + " storage. Unused credit is released at the end." +
      (problems.length ? '<div class="error">' + problems.join(" ") + "</div>" : "");
    document.getElementById("rent-confirm").disabled = problems.length > 0;
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest(".rent-button");
    if (!button) return;
    current = {
      machine: button.dataset.machine, free: +button.dataset.free, min: +button.dataset.min || 1,
      price: +button.dataset.price, storage: +button.dataset.storage, disk: +button.dataset.disk,
      end: button.dataset.end,
    };
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
    form.num_gpus.value = Math.max(current.min, 1);
    updatePrice();
    dialog.showModal();
  });
  form.addEventListener("input", updatePrice);
  document.getElementById("rent-cancel").addEventListener("click", function () { dialog.close(); });
})();
