GREETING = "helper imported from the script's directory"
