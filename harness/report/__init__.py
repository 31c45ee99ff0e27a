"""Reports: building the Report model from stored attempts, gates, comparisons, renderers
(table, Markdown, HTML, JUnit), figures and the inspection views."""
