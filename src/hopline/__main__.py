from hopline.cli import main

main()
