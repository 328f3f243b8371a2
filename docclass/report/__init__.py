"""Records → standalone HTML pages and matplotlib figures. The renderer reads explanation records
and figure files only: it never sees the model or training code."""
