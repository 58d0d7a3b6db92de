from edgedyn.cli.main import main

main()
