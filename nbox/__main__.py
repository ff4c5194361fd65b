from nbox.cli import main

main()
