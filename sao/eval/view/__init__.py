"""`sao view`: a local web page over a run, eval or gateway folder (``reader`` reads the files, ``server`` serves)."""
