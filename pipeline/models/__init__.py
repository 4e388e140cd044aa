"""Model builders shipped with the plugin (``builder = "pipeline.models.<module>:<function>"``)."""
