// A confirmation dialog (native <dialog>) asking for an optional reason; resolves to the
// reason string, or null when cancelled.
import { esc } from "./util.js";

export function confirmAction(title, body, { danger = false, okLabel = "Confirm" } = {}) {
  return new Promise((resolve) => {
    const d = document.createElement("dialog");
    d.className = "confirm";
    d.innerHTML = `<form method="dialog"><h3>${esc(title)}</h3><p>${esc(body)}</p>
      <label>reason (recorded in the audit log)<input name="reason" maxlength="1000" autocomplete="off"></label>
      <div class="btns"><button value="cancel" type="submit" class="btn">Cancel</button>
      <button value="ok" type="submit" class="btn ${danger ? "danger" : "primary"}" id="dlg-ok">${esc(okLabel)}</button></div></form>`;
    document.body.appendChild(d);
    d.addEventListener("close", () => {
      const ok = d.returnValue === "ok";
      const reason = d.querySelector("input").value.trim();
      d.remove();
      resolve(ok ? reason : null);
    });
    d.showModal();
    d.querySelector("input").focus();
  });
}
