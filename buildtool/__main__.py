from buildtool.cli import main

main()
