from tunekit.cli import main

main()
