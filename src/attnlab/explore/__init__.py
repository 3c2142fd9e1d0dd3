"""The attention explorer: `attnlab explore` (page data per run kind, the page, live server)."""
