from streamkeeper.cli import main

main()
