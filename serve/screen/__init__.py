"""`POST /v1/screen`: one patient against the site's trials, or one trial against patients, ranked
by formal distance."""
