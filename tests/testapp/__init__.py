"""An installed app of the test settings whose ``workflows.py`` registers workflows, as a
site's app would: the registry, the API, the CLI, the admin and schedules start them."""
