// The Postbox admin page is rendered on the server; this only keeps it fresh and signs in from
// a link. Nothing here reads or renders event data.
"use strict";

const REFRESH_MS = 3000;

// A link of the form /#token=… signs in: the token goes into the form and is posted; it leaves
// the address bar at once and is never stored by this script.
function signInFromLink() {
  const form = document.getElementById("login-form");
  if (!form || !location.hash.startsWith("#token=")) return false;
  const token = decodeURIComponent(location.hash.slice("#token=".length));
  history.replaceState(null, "", "/");
  document.getElementById("token").value = token;
  form.submit();
  return true;
}

// The same link opened in a tab already on the page changes only the fragment.
window.addEventListener("hashchange", signInFromLink);

document.addEventListener("DOMContentLoaded", () => {
  if (signInFromLink()) return;
  // After a form post the address is /login or /retry: show /, which a reload asks for.
  history.replaceState(null, "", "/");
  // Signed in: reload the page now and then, unless the visitor is about to click.
  if (document.querySelector("main[data-signed-in]")) {
    setInterval(() => {
      if (document.activeElement && document.activeElement.tagName === "BUTTON") return;
      location.replace("/");
    }, REFRESH_MS);
  }
});
