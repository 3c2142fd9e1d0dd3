"""``attnlab serve RUN``: a trained classifier behind a JSON API (app), on the HTTP core it
shares with the explorer's live mode (http), requests that arrive together classified in one
forward pass (batcher)."""
