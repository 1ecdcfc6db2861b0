"""Reports: tables (Markdown, CSV), figures (PNG) and a static HTML page built from the results store."""
