"""The files a user writes (job files, environment files): one strict YAML reader
(`yamlfile.py`) and the declared kinds every value is checked against (`kinds.py`). Below
every other package but `errors`: run/ and provision/ read their files through it."""
