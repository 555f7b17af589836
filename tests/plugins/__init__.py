"""Test-only backend plugins, loaded through DSAHAL_PLUGIN_MODULES=plugins.<name>."""
