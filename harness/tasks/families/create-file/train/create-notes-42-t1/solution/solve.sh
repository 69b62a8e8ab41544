#!/bin/bash
echo 42 > /app/notes.txt
