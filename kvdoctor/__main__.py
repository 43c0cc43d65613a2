from kvdoctor.cli.main import entry

entry()
