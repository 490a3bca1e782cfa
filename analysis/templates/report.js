/* Long tables (class "paged"): a filter box, headers that sort on click, and pages of
   PAGE_ROWS rows.  Inlined in the page (nothing is fetched); without script every row
   shows, in the order the report wrote them. */
(() => {
  const PAGE_ROWS = Number(document.body.dataset.pageRows) || 50;
  const number = text => {
    const value = parseFloat(text.replace(/[,\s%+−]/g, m => (m === "−" ? "-" : "")));
    return Number.isFinite(value) ? value : null;
  };
  for (const table of document.querySelectorAll("table.paged")) {
    const body = table.tBodies[0];
    const rows = Array.from(body.rows);
    const tools = table.closest(".scroll").previousElementSibling;
    const filter = tools.querySelector("input[type=search]");
    const [previous, next] = tools.querySelectorAll("button");
    const count = tools.querySelector(".count");
    const state = {column: -1, descending: false, page: 0};
    const sortKey = (row, column) => {
      const text = row.cells[column].textContent.trim();
      return {text, value: number(text)};
    };
    const compare = (a, b) => {
      if (state.column < 0) return 0;
      const x = sortKey(a, state.column), y = sortKey(b, state.column);
      let order;
      if (x.value !== null && y.value !== null) order = x.value - y.value;
      else if (x.value !== null || y.value !== null) order = x.value === null ? 1 : -1;  // blanks last
      else order = x.text.localeCompare(y.text);
      return state.descending ? -order : order;
    };
    const render = () => {
      const wanted = filter.value.trim().toLowerCase();
      const kept = rows.filter(row => !wanted || row.textContent.toLowerCase().includes(wanted));
      kept.sort(compare);
      const pages = Math.max(1, Math.ceil(kept.length / PAGE_ROWS));
      state.page = Math.min(state.page, pages - 1);
      const first = state.page * PAGE_ROWS;
      const shown = new Set(kept.slice(first, first + PAGE_ROWS));
      for (const row of rows) row.hidden = !shown.has(row);
      body.append(...kept);  // the kept rows in their order, the rest after them (hidden)
      body.append(...rows.filter(row => !kept.includes(row)));
      count.textContent = kept.length
        ? `rows ${first + 1}–${Math.min(first + PAGE_ROWS, kept.length)} of ${kept.length}` +
          (kept.length < rows.length ? ` (${rows.length} in all)` : "")
        : `no row matches (${rows.length} in all)`;
      previous.disabled = state.page === 0;
      next.disabled = state.page >= pages - 1;
    };
    Array.from(table.tHead.rows[0].cells).forEach((header, column) => {
      header.classList.add("sortable");
      header.title = "click to sort";
      header.addEventListener("click", () => {
        state.descending = state.column === column ? !state.descending : false;
        state.column = column;
        state.page = 0;
        for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
        header.setAttribute("aria-sort", state.descending ? "descending" : "ascending");
        render();
      });
    });
    filter.addEventListener("input", () => { state.page = 0; render(); });
    previous.addEventListener("click", () => { state.page -= 1; render(); });
    next.addEventListener("click", () => { state.page += 1; render(); });
    tools.hidden = false;
    render();
  }
})();
