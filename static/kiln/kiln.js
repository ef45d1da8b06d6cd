/* Kiln dashboard glue: mark live sockets as open or reconnecting so the page can say so.
   Pages work without this file (and without JavaScript at all); htmx's ws extension does the swaps. */
(function () {
  "use strict";
  function mark(event, state) {
    var elt = event.detail && event.detail.elt ? event.detail.elt : event.target;
    if (elt && elt.setAttribute) { elt.setAttribute("data-ws", state); }
  }
  document.addEventListener("htmx:wsOpen", function (e) { mark(e, "open"); });
  document.addEventListener("htmx:wsClose", function (e) { mark(e, "closed"); });
  document.addEventListener("htmx:wsError", function (e) { mark(e, "closed"); });
})();
